"""What becomes receivable other than by a new offset is announced on `txhub_receivable` at its
commit, for the receives that wait (apps/broker/wakeups.py; found by the mutation review of
decision 0112): a FIFO group's message acked or dead-lettered frees its message group's next one
(decision 0054), and a dead letter sent back is receivable at once. Without the announcement a
waiting receive learns of it only at its fallback check (TXHUB_LONG_POLL_FALLBACK), or never
within its wait. The test listens on a connection of its own, as a process's wake-up hub does."""

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection
from rest_framework.test import APIClient

from apps.broker.models import Topic
from apps.broker.services import dead_letters
from apps.broker.services.sending import RECEIVABLE_CHANNEL
from tests.conftest import db_url_for_tests
from tests.support.responses import expect


@pytest.fixture
def listener(transactional_db: None) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_url_for_tests(), autocommit=True) as listening:
        listening.execute(f"LISTEN {RECEIVABLE_CHANNEL}")
        yield listening


def announced(listening: psycopg.Connection[Any], count: int) -> list[str]:
    """The next `count` announcements (waiting up to 10 s for them: they come at a commit)."""
    return [n.payload for n in listening.notifies(timeout=10, stop_after=count)]


def drain(listening: psycopg.Connection[Any]) -> None:
    """Forgets what was announced so far (the sends' own announcements)."""
    list(listening.notifies(timeout=0.2))


def send(api: APIClient, body: str, **fields: Any) -> dict[str, Any]:
    payload = {"producer_group": "order-service", "body": body, **fields}
    return dict(expect(api.post("/api/v1/topics/orders/messages", payload, format="json"), 201))


def receive(api: APIClient, **extra: Any) -> list[dict[str, Any]]:
    payload = {"topic": "orders", "invisible_seconds": 10, **extra}
    answer = api.post("/api/v1/consumer-groups/billing/receive", payload, format="json")
    return list(expect(answer, 200)["messages"])


def expire_all() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE broker_delivery SET invisible_until = now() - interval '1 second' "
            "WHERE state = 'INFLIGHT'"
        )


def topic_id() -> int:
    return int(Topic.objects.get(name="orders").pk)


def test_a_fifo_ack_announces_its_groups_next_message(
    listener: psycopg.Connection[Any], api: APIClient, setup_topic: Any
) -> None:
    setup_topic(queues=1, fifo=True)
    send(api, "x1", message_group="x")
    send(api, "x2", message_group="x")
    [head] = receive(api)
    drain(listener)
    handles = [head["receipt_handle"]]
    answer = api.post("/api/v1/consumer-groups/billing/ack", {"receipt_handles": handles}, "json")
    assert expect(answer, 200)["acked"] == handles
    assert announced(listener, 1) == [f"{topic_id()} released"]
    assert [m["body"] for m in receive(api)] == ["x2"]


def test_a_fifo_message_dead_lettered_on_expiry_announces_its_groups_next_message(
    listener: psycopg.Connection[Any], api: APIClient, setup_topic: Any
) -> None:
    setup_topic(queues=1, fifo=True, max_delivery_attempts=1)
    send(api, "x1", message_group="x")
    send(api, "x2", message_group="x")
    receive(api)
    expire_all()
    drain(listener)
    assert dead_letters.deliveries_expire() == 1  # the periodic scan's (apps/broker/tasks.py)
    assert announced(listener, 1) == [f"{topic_id()} released"]
    assert [m["body"] for m in receive(api)] == ["x2"]


def test_a_dead_letter_sent_back_is_announced(
    listener: psycopg.Connection[Any], api: APIClient, setup_topic: Any
) -> None:
    setup_topic(max_delivery_attempts=1)
    msg_id = send(api, "m")["msg_id"]
    receive(api)
    expire_all()
    assert dead_letters.deliveries_expire() == 1
    drain(listener)
    expect(api.post(f"/api/v1/consumer-groups/billing/dlq/{msg_id}/resend"), 200)
    assert announced(listener, 1) == [f"{topic_id()} resend {msg_id}"]
    assert [m["msg_id"] for m in receive(api)] == [msg_id]
