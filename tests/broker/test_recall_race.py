"""A recall and the delayed delivery never both win (docs/decisions/0055): the recall through
gunicorn, the delivery scan (services/delivery.py) in threads of this process, both on the real
test database. Each message is either recalled and never in the commit log, or delivered and
its recall answered 409. Two interleavings are forced with a lock held by a third connection;
then both run freely on many messages at once."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import requests
from django.db import connection

from apps.broker.clock import db_now
from apps.broker.models import CommitLogEntry, DelayedMessage, RecalledMessage, Topic
from apps.broker.services import delivery
from tests.conftest import Server, db_url_for_tests
from tests.support.own_connection import in_thread
from tests.support.responses import assert_error, expect
from tests.support.waiting import wait_until

BOUND = 30  # seconds any one step may take (a bound, not a measurement)


class Shop:
    def __init__(self, server: Server) -> None:
        self.server = server
        admin = server.token("admin")
        expect(self.post(admin, "/api/v1/topics", {"name": "orders", "queues": 2}), 201)
        body = {"name": "shop", "check_url": "http://127.0.0.1:9/"}
        expect(self.post(admin, "/api/v1/producer-groups", body), 201)
        self.producer = server.token("produce:shop")

    def post(
        self, headers: dict[str, str], path: str, payload: dict[str, Any] | None = None
    ) -> requests.Response:
        return requests.post(self.server.url(path), json=payload, headers=headers, timeout=BOUND)

    def send_due_in(self, seconds: float) -> str:
        due = (db_now() + timedelta(seconds=seconds)).isoformat()
        payload = {"producer_group": "shop", "body": "order", "deliver_at": due}
        sent = expect(self.post(self.producer, "/api/v1/topics/orders/messages", payload), 201)
        return str(sent["msg_id"])

    def recall(self, msg_id: str) -> requests.Response:
        return self.post(self.producer, f"/api/v1/messages/{msg_id}/recall")


@pytest.fixture
def shop(server: Server) -> Shop:
    return Shop(server)


@contextmanager
def holding(sql: str, params: list[Any]) -> Iterator[None]:
    """A third connection holds the row locks `sql` takes until the block ends."""
    with psycopg.connect(db_url_for_tests()) as blocker:
        blocker.execute(sql, params)
        yield
        blocker.rollback()


def waiting_on_a_lock(fragment: str) -> bool:
    """Whether a backend of this test's database is waiting for a lock while running a
    statement containing `fragment` (the other side has reached the lock the test holds).
    Another test process's backends, on its own database, are waiting for locks of their own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database() AND query LIKE %s AND pid <> pg_backend_pid()",
            [f"%{fragment}%"],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def due(msg_id: str) -> None:
    deliver_at = DelayedMessage.objects.get(msg_id=msg_id).deliver_at
    wait_until(lambda: db_now() > deliver_at, timeout=BOUND, interval=0.05)


def test_a_recall_waiting_behind_the_delivery_is_409(shop: Shop) -> None:
    """The scan locks the delayed row first (and waits for the queue row the test holds); the
    recall waits for the delayed row; the scan delivers it; the recall answers 409."""
    msg_id = shop.send_due_in(0.3)
    due(msg_id)
    topic = Topic.objects.get(name="orders")
    with holding("SELECT 1 FROM broker_messagequeue WHERE topic_id = %s FOR UPDATE", [topic.pk]):
        scan = in_thread(delivery.delayed_deliver_due)
        wait_until(lambda: waiting_on_a_lock("broker_messagequeue"), timeout=BOUND)
        recall = in_thread(lambda: shop.recall(msg_id))
        wait_until(lambda: waiting_on_a_lock("broker_delayedmessage"), timeout=BOUND)
        assert not recall.done()
    assert scan.result(timeout=BOUND) == 1
    error = assert_error(recall.result(timeout=BOUND), 409, "conflict")
    assert error["details"] == {"state": "DELIVERED"}
    assert list(CommitLogEntry.objects.values_list("msg_id", flat=True)) == [msg_id]
    assert not RecalledMessage.objects.exists()


def test_a_delivery_finding_the_recall_first_skips_the_message(shop: Shop) -> None:
    """The recall locks the delayed row first (and waits for the topic row the test holds, to
    commit its record); the scan skips the locked row and delivers nothing; the recall wins."""
    msg_id = shop.send_due_in(0.3)
    due(msg_id)
    topic = Topic.objects.get(name="orders")
    with holding("SELECT 1 FROM broker_topic WHERE id = %s FOR UPDATE", [topic.pk]):
        recall = in_thread(lambda: shop.recall(msg_id))
        # Its record's foreign key is checked at COMMIT (deferred): it waits there, the delayed
        # row locked and deleted.
        wait_until(lambda: waiting_on_a_lock("COMMIT"), timeout=BOUND)
        # The scan neither waits for the recall nor delivers the message.
        assert in_thread(delivery.delayed_deliver_due).result(timeout=BOUND) == 0
        assert not recall.done()
    assert expect(recall.result(timeout=BOUND), 200)["msg_id"] == msg_id
    assert delivery.delayed_deliver_due() == 0
    assert not CommitLogEntry.objects.exists()
    assert list(RecalledMessage.objects.values_list("msg_id", flat=True)) == [msg_id]


def test_recalls_and_deliveries_racing_on_many_messages_never_both_win(shop: Shop) -> None:
    ids = [shop.send_due_in(1.0) for _ in range(40)]
    due(ids[-1])
    start = threading.Barrier(8)
    answered = threading.Event()

    def scan() -> int:
        # Once recalls are under way, one message at a time, in due order: the scans and the
        # recalls meet in the middle of the list.
        assert answered.wait(timeout=BOUND)
        moved = 0
        while DelayedMessage.objects.exists():
            moved += delivery.delayed_deliver_due(limit=1)
        return moved

    def recall(chunk: list[str]) -> dict[str, int]:
        start.wait(timeout=BOUND)
        codes = {}
        for msg_id in chunk:
            codes[msg_id] = shop.recall(msg_id).status_code
            answered.set()
        return codes

    scans = [in_thread(scan) for _ in range(2)]
    recalls = [in_thread(lambda chunk=ids[i::8]: recall(chunk)) for i in range(8)]  # type: ignore[misc]
    moved = sum(s.result(timeout=4 * BOUND) for s in scans)
    codes: dict[str, int] = {}
    for r in recalls:
        codes.update(r.result(timeout=4 * BOUND))

    delivered = set(CommitLogEntry.objects.values_list("msg_id", flat=True))
    recalled = set(RecalledMessage.objects.values_list("msg_id", flat=True))
    assert moved == len(delivered)
    assert not DelayedMessage.objects.exists()
    for msg_id in ids:
        assert (msg_id in delivered) != (msg_id in recalled), msg_id
        assert codes[msg_id] == (200 if msg_id in recalled else 409), (msg_id, codes[msg_id])
    assert delivered | recalled == set(ids)
