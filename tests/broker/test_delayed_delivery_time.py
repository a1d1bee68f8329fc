"""CONTRACT invariant 8: a delayed message is never visible before its delivery time on the
database clock, however close that time is when the delivery scan runs."""

import re
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from rest_framework.test import APIClient

from apps.broker.clock import db_now
from apps.broker.models import CommitLogEntry, DelayedMessage
from apps.broker.services import delivery
from tests.support.responses import expect
from tests.support.waiting import wait_until


def receive(api: APIClient) -> list[dict[str, Any]]:
    path = "/api/v1/consumer-groups/billing/receive"
    answer = api.post(path, {"topic": "orders", "max_messages": 32}, format="json")
    return list(expect(answer, 200)["messages"])


def send_due_soon(api: APIClient, body: str) -> tuple[dict[str, Any], datetime]:
    """A message due 0.8 s from now on the database clock, and the time it is due."""
    payload = {
        "producer_group": "order-service",
        "body": body,
        "deliver_at": (db_now() + timedelta(seconds=0.8)).isoformat(),
    }
    sent = expect(api.post("/api/v1/topics/orders/messages", payload, format="json"), 201)
    assert sent["queue_offset"] is None
    return sent, datetime.fromisoformat(sent["deliver_at"])


def test_a_message_due_in_under_a_second_is_not_moved_by_a_scan_before_its_time(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    # A scan that ends after its message is due says nothing; a machine too busy to scan within
    # 0.8 s gets a few more messages, and the test fails if no scan ran in time (decision 0116).
    for attempt in range(5):
        sent, due = send_due_soon(api, f"soon {attempt}")
        delivery.delayed_deliver_due()
        if db_now() < due:
            break
    else:
        raise AssertionError("no scan ended before its message was due in 5 tries")
    assert not CommitLogEntry.objects.filter(msg_id=sent["msg_id"]).exists()
    assert sent["msg_id"] not in [got["msg_id"] for got in receive(api)]
    # Positive control: once due, the same scan moves it.
    wait_until(lambda: db_now() >= due, timeout=10, interval=0.05)
    delivery.delayed_deliver_due()
    assert sent["msg_id"] in [got["msg_id"] for got in receive(api)]
    stored = CommitLogEntry.objects.get(msg_id=sent["msg_id"])
    assert stored.stored_at >= due


def test_a_delayed_message_is_delivered_as_it_was_sent_and_keeps_its_birth(
    api: APIClient, setup_topic: Any
) -> None:
    """Moved from the delayed table to the log, a message keeps its tag, keys and properties,
    and its birth is the send's, not the delivery's (sending.OutgoingMessage.of)."""
    setup_topic()
    payload = {
        "producer_group": "order-service",
        "body": "later",
        "tags": "TagA",
        "keys": ["9527", "order"],
        "properties": {"region": "eu", "kind": "created"},
        "deliver_at": (db_now() + timedelta(hours=1)).isoformat(),
    }
    sent = expect(api.post("/api/v1/topics/orders/messages", payload, format="json"), 201)
    [waiting] = DelayedMessage.objects.all()
    born = waiting.born_at
    DelayedMessage.objects.update(deliver_at=db_now() - timedelta(seconds=1))
    assert delivery.delayed_deliver_due() == 1

    [got] = receive(api)
    assert got["msg_id"] == sent["msg_id"]
    assert (got["tags"], got["keys"], got["properties"]) == (
        payload["tags"],
        payload["keys"],
        payload["properties"],
    )
    assert datetime.fromisoformat(got["born_at"]) == born
    assert datetime.fromisoformat(got["stored_at"]) > born


def test_a_delay_of_exactly_the_maximum_is_taken_and_one_beyond_is_refused(
    api: APIClient, setup_topic: Any, settings: Any
) -> None:
    """Decision 0112: the bound is inclusive. Delay level 18 is 2 h: exactly TXHUB_MAX_DELAY at
    7200 s, one second beyond it at 7199 s, whatever the server's clock says when it sends."""
    setup_topic()
    payload = {"producer_group": "order-service", "body": "late", "delay_level": 18}
    settings.TXHUB_MAX_DELAY = 7199
    refused = api.post("/api/v1/topics/orders/messages", payload, format="json")
    assert refused.status_code == 400, refused.json()
    assert refused.json()["error"]["details"] == {
        "deliver_at": ["The delivery time is more than TXHUB_MAX_DELAY (7199 s) away."]
    }
    assert not DelayedMessage.objects.exists()
    settings.TXHUB_MAX_DELAY = 7200
    sent = expect(api.post("/api/v1/topics/orders/messages", payload, format="json"), 201)
    assert sent["queue_offset"] is None
    assert DelayedMessage.objects.get().msg_id == sent["msg_id"]


def test_a_queues_due_messages_are_appended_in_the_order_due(
    api: APIClient, setup_topic: Any
) -> None:
    """Decision 0112: a scan that finds several of a queue's messages due appends them in the
    order they fell due, not the order they were sent."""
    setup_topic(queues=1)
    sent = []
    for body in ("sooner", "later"):
        payload = {"producer_group": "order-service", "body": body, "delay_level": 17}
        sent.append(expect(api.post("/api/v1/topics/orders/messages", payload, "json"), 201))
    # Both fell due while no scan ran: "sooner" a minute before "later".
    for minutes, message in zip((2, 1), sent, strict=True):
        DelayedMessage.objects.filter(msg_id=message["msg_id"]).update(
            deliver_at=db_now() - timedelta(minutes=minutes)
        )
    assert delivery.delayed_deliver_due() == 2
    got = receive(api)
    assert [(m["body"], m["queue_offset"]) for m in got] == [("sooner", 0), ("later", 1)]


# CONTRACT section 3: the RocketMQ delay levels 1..18.
CONTRACT_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}


def test_each_delay_level_is_its_rocketmq_delay(api: APIClient, setup_topic: Any) -> None:
    """Decision 0112: the delivery time of level n is the n-th delay of the contract's list,
    counted from the send (the answer's `deliver_at`), for each of the 18."""
    setup_topic()
    levels = re.findall(r"(\d+)([smh])", CONTRACT_LEVELS)
    assert len(levels) == 18
    for level, (count, unit) in enumerate(levels, start=1):
        seconds = int(count) * UNIT_SECONDS[unit]
        payload = {"producer_group": "order-service", "body": "later", "delay_level": level}
        before = timezone.now()
        sent = expect(api.post("/api/v1/topics/orders/messages", payload, format="json"), 201)
        after = timezone.now()
        due = datetime.fromisoformat(sent["deliver_at"])
        assert before + timedelta(seconds=seconds) <= due <= after + timedelta(seconds=seconds), (
            level,
            due - before,
        )
