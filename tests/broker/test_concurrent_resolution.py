"""CONTRACT invariant 2 under concurrency, over real HTTP against gunicorn: a commit and a
rollback racing on one transaction resolve it exactly once."""

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from apps.broker.models import CommitLogEntry, HalfMessage, OpRecord
from tests.conftest import Server
from tests.support.responses import assert_error, expect

N = 32


def post(
    server: Server, headers: dict[str, str], path: str, payload: dict[str, Any] | None = None
) -> requests.Response:
    return requests.post(server.url(path), json=payload or {}, headers=headers, timeout=30)


def test_concurrent_commit_and_rollback_resolve_each_transaction_once(server: Server) -> None:
    admin = server.token("admin")
    expect(post(server, admin, "/api/v1/topics", {"name": "orders", "queues": 2}), 201)
    group = post(
        server,
        admin,
        "/api/v1/producer-groups",
        {"name": "shop", "check_url": "http://127.0.0.1:9/"},
    )
    expect(group, 201)
    expect(post(server, admin, "/api/v1/consumer-groups", {"name": "billing"}), 201)
    producer = server.token("produce:shop")
    ids = [
        expect(
            post(
                server,
                producer,
                "/api/v1/transactions",
                {"producer_group": "shop", "topic": "orders", "body": f"order {i}"},
            ),
            201,
        )["transaction_id"]
        for i in range(N)
    ]

    def race(transaction_id: str) -> dict[str, int]:
        barrier = threading.Barrier(2)

        def resolve(outcome: str) -> int:
            barrier.wait(timeout=30)
            response = post(server, producer, f"/api/v1/transactions/{transaction_id}/{outcome}")
            if response.status_code == 409:  # the loser is told why, in the contract's format
                assert_error(response, 409, "transaction_resolved")
            return response.status_code

        with ThreadPoolExecutor(2) as pool:
            commit = pool.submit(resolve, "commit")
            rollback = pool.submit(resolve, "rollback")
            return {"commit": commit.result(), "rollback": rollback.result()}

    with ThreadPoolExecutor(8) as pool:
        results = dict(zip(ids, pool.map(race, ids), strict=True))

    committed = set()
    for transaction_id, codes in results.items():
        assert sorted(codes.values()) == [200, 409], (transaction_id, codes)
        half = HalfMessage.objects.get(transaction_id=transaction_id)
        winner = "commit" if codes["commit"] == 200 else "rollback"
        assert half.state == ("COMMITTED" if winner == "commit" else "ROLLED_BACK")
        finals = OpRecord.objects.filter(half=half, op__in=["COMMIT", "ROLLBACK"])
        assert [op.op for op in finals] == [winner.upper()]
        if winner == "commit":
            committed.add(half.msg_id)
    assert CommitLogEntry.objects.count() == len(committed)

    consumer = server.token("consume:billing")
    received: set[str] = set()
    while True:
        batch = expect(
            post(
                server,
                consumer,
                "/api/v1/consumer-groups/billing/receive",
                {"topic": "orders", "max_messages": 32},
            ),
            200,
        )["messages"]
        if not batch:
            break
        received |= {m["msg_id"] for m in batch}
    assert received == committed
