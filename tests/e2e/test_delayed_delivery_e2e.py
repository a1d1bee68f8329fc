"""Delayed delivery end to end with real Celery (CONTRACT invariant 8): never visible before its
time on the database clock, delivered once, counted from the commit for transactions."""

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from tests.support.responses import expect
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.perf]


@pytest.fixture
def orders(api: APIClient) -> None:
    expect(api.post("/api/v1/topics", {"name": "orders", "queues": 2}, format="json"), 201)
    group = api.post(
        "/api/v1/producer-groups",
        {"name": "shop", "check_url": "http://127.0.0.1:9/"},
        format="json",
    )
    expect(group, 201)
    expect(api.post("/api/v1/consumer-groups", {"name": "billing"}, format="json"), 201)


def send(api: APIClient, body: str, **extra: Any) -> dict[str, Any]:
    response = api.post(
        "/api/v1/topics/orders/messages",
        {"producer_group": "shop", "body": body, **extra},
        format="json",
    )
    assert response.status_code == 201, response.json()
    return dict(response.json())


def receive(api: APIClient) -> list[dict[str, Any]]:
    response = api.post(
        "/api/v1/consumer-groups/billing/receive",
        {"topic": "orders", "max_messages": 32},
        format="json",
    )
    return list(expect(response, 200)["messages"])


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]  # type: ignore[no-any-return]


def test_delay_level_1_arrives_after_about_a_second_and_not_before(
    celery_processes: Any, api: APIClient, orders: None
) -> None:
    sent = send(api, "later", delay_level=1)
    assert sent["queue_offset"] is None
    due = datetime.fromisoformat(sent["deliver_at"])
    assert receive(api) == []
    got = wait_until(lambda: receive(api), timeout=10, interval=0.05)
    arrived = db_now()
    assert [m["body"] for m in got] == ["later"]
    assert datetime.fromisoformat(got[0]["stored_at"]) >= due  # never before its time
    assert arrived - due < timedelta(seconds=2.5)


def test_deliver_at_is_honoured_within_tolerance_and_the_past_is_immediate(
    celery_processes: Any, api: APIClient, orders: None
) -> None:
    due = datetime.now(UTC) + timedelta(seconds=3)
    send(api, "at", deliver_at=due.isoformat())
    past = send(api, "past", deliver_at=(datetime.now(UTC) - timedelta(hours=1)).isoformat())
    assert past["queue_offset"] is not None
    assert [m["body"] for m in receive(api)] == ["past"]
    time.sleep(1.5)  # three scans later, and still 1.5 s early
    assert receive(api) == []
    got = wait_until(lambda: receive(api), timeout=10, interval=0.05)
    assert [m["body"] for m in got] == ["at"]
    stored = datetime.fromisoformat(got[0]["stored_at"])
    assert due <= stored < due + timedelta(seconds=2)


def test_a_delayed_transaction_is_counted_from_its_commit(
    celery_processes: Any, api: APIClient, orders: None
) -> None:
    prepared = api.post(
        "/api/v1/transactions",
        {"producer_group": "shop", "topic": "orders", "body": "tx", "delay_level": 1},  # 1 s
        format="json",
    )
    tx = expect(prepared, 201)
    # Time before the commit does not count: counted from the prepare, the delay would be over
    # at the commit, and the message in the log at once.
    time.sleep(2)
    committed = expect(
        api.post(f"/api/v1/transactions/{tx['transaction_id']}/commit", format="json"), 200
    )
    assert committed["queue_offset"] is None
    due = datetime.fromisoformat(committed["deliver_at"])
    assert due - datetime.fromisoformat(committed["resolved_at"]) == timedelta(seconds=1)
    assert receive(api) == []
    again = expect(
        api.post(f"/api/v1/transactions/{tx['transaction_id']}/commit", format="json"), 200
    )
    assert again == committed
    got = wait_until(lambda: receive(api), timeout=10, interval=0.05)
    assert [m["transaction_id"] for m in got] == [tx["transaction_id"]]
    assert datetime.fromisoformat(got[0]["stored_at"]) >= due
