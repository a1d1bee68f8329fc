"""Check-back end to end: real Celery worker and beat, a real HTTP checker on the producer side
(CONTRACT section 4, invariant 7)."""

import time
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.broker.models import HalfMessage, OpRecord
from tests.support.responses import expect
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def shop(api: APIClient, checker: Any) -> dict[str, Any]:
    expect(api.post("/api/v1/topics", {"name": "orders", "queues": 2}, format="json"), 201)
    group = expect(
        api.post(
            "/api/v1/producer-groups", {"name": "shop", "check_url": checker.url}, format="json"
        ),
        201,
    )
    expect(api.post("/api/v1/consumer-groups", {"name": "billing"}, format="json"), 201)
    return {"secret": group["signing_secret"]}


def prepare(api: APIClient, body: str = "order", **extra: Any) -> dict[str, Any]:
    response = api.post(
        "/api/v1/transactions",
        {"producer_group": "shop", "topic": "orders", "body": body, **extra},
        format="json",
    )
    assert response.status_code == 201
    return dict(response.json())


def state(transaction_id: str) -> str:
    return str(HalfMessage.objects.get(transaction_id=transaction_id).state)


def received_bodies(api: APIClient) -> list[str]:
    bodies: list[str] = []
    while batch := expect(
        api.post(
            "/api/v1/consumer-groups/billing/receive",
            {"topic": "orders", "max_messages": 32},
            format="json",
        ),
        200,
    )["messages"]:
        bodies += [m["body"] for m in batch]
    return sorted(bodies)


def test_checker_commit_delivers_and_checker_rollback_never_does(
    celery_processes: Any, api: APIClient, shop: Any, checker: Any
) -> None:
    checker.decide = lambda body: (
        200,
        b'{"state": "%s"}' % (b"COMMIT" if body["body"] == "yes" else b"ROLLBACK_MESSAGE"),
    )
    yes, no = prepare(api, "yes"), prepare(api, "no")
    assert wait_until(
        lambda: (
            state(yes["transaction_id"]) == "COMMITTED"
            and state(no["transaction_id"]) == "ROLLED_BACK"
        )
    )
    detail = expect(api.get(f"/api/v1/transactions/{yes['transaction_id']}"), 200)
    assert detail["resolved_by"] == "CHECK_BACK"
    assert [h["op"] for h in detail["history"]] == ["PREPARE", "CHECK", "COMMIT"]
    assert detail["history"][1]["detail"]["answer"] == "COMMIT"
    assert received_bodies(api) == ["yes"]


def test_ten_transactions_even_committed_odd_rolled_back(
    celery_processes: Any, api: APIClient, shop: Any, checker: Any
) -> None:
    checker.decide = lambda body: (
        200,
        b'{"state": "%s"}' % (b"COMMIT" if int(body["body"]) % 2 == 0 else b"ROLLBACK"),
    )
    ids = [prepare(api, str(i))["transaction_id"] for i in range(10)]
    assert wait_until(
        lambda: not HalfMessage.objects.filter(transaction_id__in=ids, state="PREPARED").exists()
    )
    assert received_bodies(api) == sorted(str(i) for i in range(0, 10, 2))
    for transaction_id in ids:
        assert (
            OpRecord.objects.filter(
                half__transaction_id=transaction_id, op__in=["COMMIT", "ROLLBACK"]
            ).count()
            == 1
        )


def test_unknown_forever_parks_after_check_max_and_resume_checks_again(
    celery_processes: Any, api: APIClient, shop: Any, checker: Any
) -> None:
    checker.answer("UNKNOWN")
    tx = prepare(api)
    assert wait_until(lambda: state(tx["transaction_id"]) == "PARKED", timeout=30)
    assert len(checker.checks_of(tx["transaction_id"])) == 3  # TXHUB_CHECK_MAX in these tests
    # The positive control: a transaction prepared now is checked twice (two check intervals of
    # scans) in the window in which the parked one must get none.
    control = prepare(api, "control")
    assert wait_until(lambda: len(checker.checks_of(control["transaction_id"])) >= 2, timeout=30)
    assert len(checker.checks_of(tx["transaction_id"])) == 3  # parked: no more checks
    resumed = expect(
        api.post(f"/api/v1/transactions/{tx['transaction_id']}/resume", format="json"), 200
    )
    assert resumed["check_times"] == 0
    checker.answer("COMMIT")
    assert wait_until(lambda: state(tx["transaction_id"]) == "COMMITTED")
    detail = expect(api.get(f"/api/v1/transactions/{tx['transaction_id']}"), 200)
    ops = [h["op"] for h in detail["history"]]
    assert ops == ["PREPARE", "CHECK", "CHECK", "CHECK", "PARK", "RESUME", "CHECK", "COMMIT"]


def test_a_garbage_answer_is_never_a_decision(
    celery_processes: Any, api: APIClient, shop: Any, checker: Any
) -> None:
    answers = iter([(200, b'{"state": "YES"}'), (500, b'{"state": "COMMIT"}'), (200, b"COMMIT")])
    checker.decide = lambda body: next(answers, (200, b"{}"))
    tx = prepare(api)
    assert wait_until(lambda: state(tx["transaction_id"]) == "PARKED", timeout=30)
    checks = OpRecord.objects.filter(half__transaction_id=tx["transaction_id"], op="CHECK")
    assert [c.detail["answer"] for c in checks] == ["UNKNOWN", "UNKNOWN", "UNKNOWN"]
    assert received_bodies(api) == []


def test_no_check_is_sent_after_the_producer_resolved(
    celery_processes: Any, api: APIClient, shop: Any, checker: Any
) -> None:
    checker.answer("ROLLBACK")
    tx = prepare(api, "mine")
    # The positive control, prepared just after: due no sooner than "mine" would have been, so
    # once it has been checked, a scan has passed over "mine"'s due time.
    control = prepare(api, "control")
    expect(api.post(f"/api/v1/transactions/{tx['transaction_id']}/commit", format="json"), 200)
    time.sleep(4)  # timeout 1 s, scans every 0.5 s
    assert wait_until(lambda: state(control["transaction_id"]) == "ROLLED_BACK", timeout=30)
    assert len(checker.checks_of(control["transaction_id"])) == 1
    assert checker.checks_of(tx["transaction_id"]) == []
    assert state(tx["transaction_id"]) == "COMMITTED"


def test_check_immunity_delays_the_first_check(
    celery_processes: Any, api: APIClient, shop: Any, checker: Any
) -> None:
    checker.answer("COMMIT")
    started = time.time()
    tx = prepare(api, check_immunity_seconds=4)
    assert wait_until(lambda: checker.checks_of(tx["transaction_id"]), timeout=15)
    first = checker.checks_of(tx["transaction_id"])[0]
    assert int(first["headers"]["webhook-timestamp"]) >= int(started) + 4 - 1
    assert time.time() - started >= 4


def test_an_unreachable_checker_is_retried_without_using_the_budget(
    celery_processes: Any, api: APIClient
) -> None:
    expect(api.post("/api/v1/topics", {"name": "orders", "queues": 1}, format="json"), 201)
    group = api.post(
        "/api/v1/producer-groups",
        {"name": "shop", "check_url": "http://127.0.0.1:9/nobody"},
        format="json",
    )
    expect(group, 201)
    tx = prepare(api)
    assert wait_until(
        lambda: (
            OpRecord.objects.filter(half__transaction_id=tx["transaction_id"], op="CHECK").count()
            >= 4
        ),
        timeout=30,
    )
    half = HalfMessage.objects.get(transaction_id=tx["transaction_id"])
    assert half.state == "PREPARED"  # 4 attempts > TXHUB_CHECK_MAX (3), yet not parked
    assert half.check_times == 0
    check = OpRecord.objects.filter(half=half, op="CHECK").first()
    assert check is not None
    assert check.detail["reached"] is False
