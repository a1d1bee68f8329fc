"""CONTRACT invariant 8: a delayed message is never visible before its delivery time on the
database clock, however close that time is when the delivery scan runs."""

from datetime import datetime, timedelta
from typing import Any

from rest_framework.test import APIClient

from apps.broker.clock import db_now
from apps.broker.models import CommitLogEntry
from apps.broker.services import delivery
from tests.support.responses import expect
from tests.support.waiting import wait_until


def receive(api: APIClient) -> list[dict[str, Any]]:
    path = "/api/v1/consumer-groups/billing/receive"
    answer = api.post(path, {"topic": "orders", "max_messages": 32}, format="json")
    return list(expect(answer, 200)["messages"])


def test_a_message_due_in_under_a_second_is_not_moved_by_a_scan_before_its_time(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    payload = {
        "producer_group": "order-service",
        "body": "soon",
        "deliver_at": (db_now() + timedelta(seconds=0.8)).isoformat(),
    }
    sent = expect(api.post("/api/v1/topics/orders/messages", payload, format="json"), 201)
    assert sent["queue_offset"] is None
    due = datetime.fromisoformat(sent["deliver_at"])
    moved = delivery.delayed_deliver_due()
    scanned_at = db_now()
    # The scan ran before the message was due, or this test saw nothing (decision 0116).
    assert scanned_at < due, f"the scan ended {scanned_at - due} after the message was due"
    assert moved == 0
    assert receive(api) == []
    assert not CommitLogEntry.objects.exists()
    # Positive control: once due, the same scan moves it.
    wait_until(lambda: db_now() >= due, timeout=10, interval=0.05)
    delivery.delayed_deliver_due()
    [got] = receive(api)
    assert got["msg_id"] == sent["msg_id"]
    assert datetime.fromisoformat(got["stored_at"]) >= due
