"""Batches (CONTRACT section 2): messages:batch, transactions:batch, transactions:commit and
:rollback. All-or-nothing input, one outcome per id, no deadlock between opposite orders, and
offsets still dense (invariant 5) when batches commit concurrently."""

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import requests
from django.utils import timezone
from rest_framework.test import APIClient

from apps.broker.models import CommitLogEntry, DelayedMessage, HalfMessage, OpRecord
from tests.conftest import Server
from tests.support.responses import assert_error, expect
from tests.support.transactions import commit_written

SEND = "/api/v1/topics/orders/messages:batch"


def send_batch(api: APIClient, messages: Any, **extra: Any) -> Any:
    return api.post(
        SEND, {"producer_group": "order-service", "messages": messages}, format="json", **extra
    )


def prepare_batch(api: APIClient, count: int, group: str = "order-service") -> list[str]:
    answer = api.post(
        "/api/v1/transactions:batch",
        {
            "producer_group": group,
            "topic": "orders",
            "messages": [{"body": f"tx {n}"} for n in range(count)],
        },
        format="json",
    )
    return [r["transaction_id"] for r in expect(answer, 201)["results"]]


def resolve(api: APIClient, outcome: str, ids: Any) -> Any:
    return api.post(f"/api/v1/transactions:{outcome}", {"transaction_ids": ids}, format="json")


def test_a_batch_send_stores_every_message_in_order_with_its_fields(
    api: APIClient, setup_topic: Any
) -> None:
    names = setup_topic()
    answer = send_batch(
        api,
        [
            {"body": "first", "tags": "a", "keys": ["k1"], "properties": {"p": "1"}},
            {"body_base64": "AAEC"},
            {"body": "later", "delay_level": 3},
        ],
    )
    results = expect(answer, 201)["results"]
    assert [r["status"] for r in results] == ["SEND_OK"] * 3
    assert results[2]["queue_offset"] is None  # delayed: no offset until due
    stored = {e.msg_id: e for e in CommitLogEntry.objects.all()}
    assert set(stored) == {results[0]["msg_id"], results[1]["msg_id"]}
    first = stored[results[0]["msg_id"]]
    assert (bytes(first.body), first.tags, first.keys, first.properties) == (
        b"first",
        "a",
        ["k1"],
        {"p": "1"},
    )
    assert bytes(stored[results[1]["msg_id"]].body) == b"\x00\x01\x02"
    assert DelayedMessage.objects.get().msg_id == results[2]["msg_id"]
    received = api.post(
        f"/api/v1/consumer-groups/{names['consumer']}/receive",
        {"topic": "orders", "max_messages": 32},
        format="json",
    )
    assert {m["msg_id"] for m in expect(received, 200)["messages"]} == set(stored)


def test_a_batch_that_starts_with_a_delayed_message_is_stored(
    api: APIClient, setup_topic: Any
) -> None:
    """A delayed first message on another queue than the batch's visible ones (a KeyError once,
    found by Schemathesis: tests/test_fuzz_api.py)."""
    setup_topic(queues=16)
    for _ in range(8):  # the two land on different queues 15 times in 16
        answer = send_batch(api, [{"body": "later", "delay_level": 3}, {"body": "now"}])
        results = expect(answer, 201)["results"]
        assert results[0]["queue_offset"] is None
        assert results[1]["queue_offset"] is not None
    assert DelayedMessage.objects.count() == 8
    assert CommitLogEntry.objects.count() == 8


def test_one_bad_message_refuses_the_whole_batch_and_names_it(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    bad_items: list[Any] = [
        {"body": "x", "body_base64": "eA=="},  # both bodies
        {"body": "x", "properties": {"a\x00": "b"}},  # NUL in a property key
        {"body": "x", "producer_group": "order-service"},  # named once, by the batch
        {"body": "x", "delay_level": 19},
        {"body": "x", "deliver_at": "0001-01-01T00:00:00+01:00"},
        "not an object",
    ]
    for bad in bad_items:
        answer = send_batch(api, [{"body": "fine"}, {"body": "fine too"}, bad])
        error = assert_error(answer, 400, "invalid_request")
        assert "messages" in error["details"] or "deliver_at" in str(error["details"]), error
    assert CommitLogEntry.objects.count() == 0
    assert DelayedMessage.objects.count() == 0


def test_batch_sizes_are_checked_before_anything_is_stored(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    assert_error(send_batch(api, [{"body": "x"}] * 65), 400, "invalid_request")
    assert_error(send_batch(api, []), 400, "invalid_request")
    assert_error(send_batch(api, {"body": "x"}), 400, "invalid_request")  # not a list
    two_and_a_half_mib = "x" * (5 * 1024 * 1024 // 2)
    too_much = send_batch(api, [{"body": two_and_a_half_mib}, {"body": two_and_a_half_mib}])
    assert_error(too_much, 413, "payload_too_large")
    assert CommitLogEntry.objects.count() == 0
    expect(send_batch(api, [{"body": "x"}] * 64), 201)  # the limit itself is fine
    assert CommitLogEntry.objects.count() == 64


def test_a_batch_over_4_mib_by_one_byte_is_413_and_exactly_4_mib_is_stored(
    api: APIClient, setup_topic: Any
) -> None:
    # The batch limit is the bodies' bytes in all (CONTRACT section 6), to the byte.
    setup_topic()
    two_mib = "x" * (2 * 1024 * 1024)
    over = send_batch(api, [{"body": two_mib}, {"body": two_mib + "y"}])
    assert_error(over, 413, "payload_too_large")
    assert CommitLogEntry.objects.count() == 0
    expect(send_batch(api, [{"body": two_mib}, {"body": two_mib}]), 201)
    assert CommitLogEntry.objects.count() == 2


def test_batches_check_scopes_and_topics_like_single_sends(
    api: APIClient, setup_topic: Any, make_client: Any
) -> None:
    setup_topic()
    stranger = make_client("produce:someone-else")
    assert_error(send_batch(stranger, [{"body": "x"}]), 403, "forbidden")
    answer = stranger.post(
        "/api/v1/transactions:batch",
        {"producer_group": "order-service", "topic": "orders", "messages": [{"body": "x"}]},
        format="json",
    )
    assert_error(answer, 403, "forbidden")
    missing = api.post(
        "/api/v1/topics/nowhere/messages:batch",
        {"producer_group": "order-service", "messages": [{"body": "x"}]},
        format="json",
    )
    assert_error(missing, 404, "not_found")
    assert CommitLogEntry.objects.count() == HalfMessage.objects.count() == 0


def test_a_batch_send_retried_with_its_key_is_stored_once(api: APIClient, setup_topic: Any) -> None:
    setup_topic()
    messages = [{"body": "a"}, {"body": "b"}]
    first = expect(send_batch(api, messages, HTTP_IDEMPOTENCY_KEY="batch-1"), 201)
    again = send_batch(api, messages, HTTP_IDEMPOTENCY_KEY="batch-1")
    assert expect(again, 201) == first
    assert again.headers["Idempotent-Replayed"] == "true"
    assert CommitLogEntry.objects.count() == 2
    other = send_batch(api, [{"body": "c"}], HTTP_IDEMPOTENCY_KEY="batch-1")
    assert_error(other, 409, "conflict")


def test_a_batch_prepare_stores_half_messages_and_their_prepare_ops(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    ids = prepare_batch(api, 3)
    halves = HalfMessage.objects.filter(transaction_id__in=ids)
    assert sorted(h.state for h in halves) == ["PREPARED"] * 3
    assert OpRecord.objects.filter(half__in=halves, op="PREPARE").count() == 3
    assert CommitLogEntry.objects.count() == 0


def test_a_batch_commit_answers_each_id_on_its_own(
    api: APIClient, setup_topic: Any, make_client: Any
) -> None:
    setup_topic()
    api.post(
        "/api/v1/producer-groups",
        {"name": "other-shop", "check_url": "http://127.0.0.1:9/"},
        format="json",
    )
    fine, rolled_back, committed_before = prepare_batch(api, 3)
    [foreign] = prepare_batch(api, 1, group="other-shop")
    expect(resolve(api, "rollback", [rolled_back]), 200)
    expect(resolve(api, "commit", [committed_before]), 200)
    unknown = str(uuid.uuid4())
    producer = make_client("produce:order-service")
    answer = resolve(producer, "commit", [fine, rolled_back, unknown, foreign, committed_before])
    slots = expect(answer, 200)["results"]
    assert [s["transaction_id"] for s in slots] == [
        fine,
        rolled_back,
        unknown,
        foreign,
        committed_before,
    ]
    assert [s["status"] for s in slots] == [200, 409, 404, 404, 200]
    assert slots[0]["result"]["state"] == "COMMITTED"
    assert slots[0]["result"]["queue_offset"] is not None
    assert slots[1]["error"]["code"] == "transaction_resolved"
    assert slots[1]["error"]["details"] == {"state": "ROLLED_BACK"}
    assert slots[2]["error"]["code"] == slots[3]["error"]["code"] == "not_found"
    assert slots[4]["result"]["state"] == "COMMITTED"  # the same outcome again: idempotent
    states = dict(HalfMessage.objects.values_list("transaction_id", "state"))
    assert states[uuid.UUID(foreign)] == "PREPARED"  # another group's: untouched
    assert CommitLogEntry.objects.count() == 2  # fine + committed_before, once each


def test_batch_resolve_input_is_checked_whole(api: APIClient, setup_topic: Any) -> None:
    setup_topic()
    [tx] = prepare_batch(api, 1)
    for bad in [[tx, tx], [tx, 12], [tx, "not-a-uuid"], [str(uuid.uuid4())] * 65, []]:
        assert_error(resolve(api, "commit", bad), 400, "invalid_request")
    assert HalfMessage.objects.get().state == "PREPARED"


def test_opposite_batches_over_the_same_ids_never_deadlock_and_agree(server: Server) -> None:
    """Commit [a..z] races rollback [z..a]: both answer (a deadlock would be a 500 after
    Postgres' deadlock_timeout), and each transaction has exactly one winner, the one the
    database shows."""
    admin = server.token("admin")
    s = requests.Session()
    for path, payload in [
        ("/api/v1/topics", {"name": "orders", "queues": 4}),
        ("/api/v1/producer-groups", {"name": "shop", "check_url": "http://127.0.0.1:9/"}),
    ]:
        expect(s.post(server.url(path), json=payload, headers=admin, timeout=30), 201)
    for round_ in range(5):
        prepared = s.post(
            server.url("/api/v1/transactions:batch"),
            json={
                "producer_group": "shop",
                "topic": "orders",
                "messages": [{"body": f"{round_}-{n}"} for n in range(40)],
            },
            headers=admin,
            timeout=30,
        )
        ids = [r["transaction_id"] for r in expect(prepared, 201)["results"]]
        barrier = threading.Barrier(2)

        def run(outcome: str, order: list[str], barrier: threading.Barrier) -> dict[str, int]:
            barrier.wait(timeout=30)  # both batches start together
            answer = requests.post(
                server.url(f"/api/v1/transactions:{outcome}"),
                json={"transaction_ids": order},
                headers=admin,
                timeout=60,
            )
            return {
                slot["transaction_id"]: slot["status"] for slot in expect(answer, 200)["results"]
            }

        with ThreadPoolExecutor(2) as pool:
            commits = pool.submit(run, "commit", ids, barrier)
            rollbacks = pool.submit(run, "rollback", ids[::-1], barrier)
            committed, rolled_back = commits.result(timeout=90), rollbacks.result(timeout=90)
        states = dict(
            HalfMessage.objects.filter(transaction_id__in=ids).values_list(
                "transaction_id", "state"
            )
        )
        for tid in ids:
            assert sorted([committed[tid], rolled_back[tid]]) == [200, 409], tid
            expected = "COMMITTED" if committed[tid] == 200 else "ROLLED_BACK"
            assert states[uuid.UUID(tid)] == expected, tid
        assert CommitLogEntry.objects.filter(transaction_id__in=ids).count() == sum(
            1 for tid in ids if committed[tid] == 200
        )


def test_concurrent_batches_leave_offsets_dense(server: Server) -> None:
    """Invariant 5 with batches: batch sends and batch commits from several threads into two
    queues; every queue's offsets are exactly 0..n-1 and each message is there once."""
    admin = server.token("admin")
    s = requests.Session()
    for path, payload in [
        ("/api/v1/topics", {"name": "ledger", "queues": 2}),
        ("/api/v1/producer-groups", {"name": "shop", "check_url": "http://127.0.0.1:9/"}),
    ]:
        expect(s.post(server.url(path), json=payload, headers=admin, timeout=30), 201)

    def produce(worker: int) -> list[str]:
        session = requests.Session()
        msg_ids: list[str] = []
        for round_ in range(4):
            sent = session.post(
                server.url("/api/v1/topics/ledger/messages:batch"),
                json={
                    "producer_group": "shop",
                    "messages": [{"body": f"s{worker}-{round_}-{n}"} for n in range(16)],
                },
                headers=admin,
                timeout=60,
            )
            msg_ids += [r["msg_id"] for r in expect(sent, 201)["results"]]
            prepared = session.post(
                server.url("/api/v1/transactions:batch"),
                json={
                    "producer_group": "shop",
                    "topic": "ledger",
                    "messages": [{"body": f"t{worker}-{round_}-{n}"} for n in range(16)],
                },
                headers=admin,
                timeout=60,
            )
            results = expect(prepared, 201)["results"]
            committed = session.post(
                server.url("/api/v1/transactions:commit"),
                json={"transaction_ids": [r["transaction_id"] for r in results]},
                headers=admin,
                timeout=60,
            )
            assert [slot["status"] for slot in expect(committed, 200)["results"]] == [200] * 16
            msg_ids += [r["msg_id"] for r in results]
        return msg_ids

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(produce, w) for w in range(4)]
        expected = [msg_id for future in futures for msg_id in future.result(timeout=180)]
    rows = list(CommitLogEntry.objects.values_list("msg_id", "queue_id", "queue_offset"))
    assert sorted(r[0] for r in rows) == sorted(expected)  # each message once
    for queue in (0, 1):
        offsets = sorted(r[2] for r in rows if r[1] == queue)
        assert offsets == list(range(len(offsets))), queue


def test_a_batch_commit_stores_what_single_commits_store_in_batch_order(
    api: APIClient, setup_topic: Any
) -> None:
    """The batch's visible commits are written per queue in one statement (committing.COMMIT_SQL):
    each commit-log row, half and COMMIT op must be what a single commit writes, and the offsets
    of one queue follow the order of the batch."""
    setup_topic(queues=1)
    messages = [
        {"body": "plain"},
        {"body_base64": "AAEC", "tags": "t", "keys": ["k1", "k2"], "properties": {"p": "v"}},
        {"body": "third", "tags": "x"},
    ]

    def prepared() -> list[str]:
        answer = api.post(
            "/api/v1/transactions:batch",
            {"producer_group": "order-service", "topic": "orders", "messages": messages},
            format="json",
        )
        return [r["transaction_id"] for r in expect(answer, 201)["results"]]

    singles, batched = prepared(), prepared()
    for tx in singles:
        expect(api.post(f"/api/v1/transactions/{tx}/commit", {"reason": "r"}, format="json"), 200)
    order = [batched[2], batched[0], batched[1]]
    slots = expect(
        api.post(
            "/api/v1/transactions:commit",
            {"transaction_ids": order, "reason": "r"},
            format="json",
        ),
        200,
    )["results"]
    assert [s["status"] for s in slots] == [200, 200, 200]
    offsets = [s["result"]["queue_offset"] for s in slots]
    assert offsets == [3, 4, 5]  # after the three single commits, in the batch's order

    for single, batch in zip(singles, batched, strict=True):
        assert commit_written(single) == commit_written(batch)
    assert commit_written(batched[1])[3:8] == (b"\x00\x01\x02", True, "t", ["k1", "k2"], {"p": "v"})
    entries = CommitLogEntry.objects.order_by("queue_offset")
    assert [e.queue_offset for e in entries] == list(range(6))
    assert [str(e.transaction_id) for e in entries][3:] == order


def test_a_batch_commit_delays_what_a_single_commit_delays(
    api: APIClient, setup_topic: Any
) -> None:
    """A delay level or a delivery time still ahead waits for its time; a delivery time passed
    since the prepare, like no delay at all, is visible at once (decision 0111)."""
    setup_topic()

    def prepare(**delay: Any) -> str:
        body = {"producer_group": "order-service", "topic": "orders", "body": "tx", **delay}
        return str(
            expect(api.post("/api/v1/transactions", body, format="json"), 201)["transaction_id"]
        )

    soon = timezone.now()
    ids = [
        prepare(delay_level=1),
        prepare(deliver_at=(soon + timedelta(hours=1)).isoformat()),
        prepare(deliver_at=(soon - timedelta(minutes=1)).isoformat()),
        prepare(),
    ]
    slots = expect(resolve(api, "commit", ids), 200)["results"]
    assert [s["status"] for s in slots] == [200] * 4
    answers = [s["result"] for s in slots]
    assert [a["state"] for a in answers] == ["COMMITTED"] * 4
    assert [a["queue_offset"] is None for a in answers] == [True, True, False, False]
    assert [a["deliver_at"] is None for a in answers] == [False, False, True, True]
    logged = CommitLogEntry.objects.values_list("transaction_id", flat=True)
    assert sorted(str(t) for t in logged) == sorted(ids[2:])
    waiting = DelayedMessage.objects.values_list("transaction_id", flat=True)
    assert sorted(str(t) for t in waiting) == sorted(ids[:2])
