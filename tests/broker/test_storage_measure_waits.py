"""A deletion that meets a storage measure under way (docs/decisions/0085, 0089) waits for it
before it takes anything else: a send to the queues a delayed delivery appends to, and a group's
first receive from a topic the retention sweep is freeing, go on meanwhile; and the commit-log row
a delayed delivery writes is counted, however long it waited. A third connection holds the
table's measure row as a measure does, for as long as the test says; every other party is the
real code on its own connection."""

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from apps.broker.clock import db_now
from apps.broker.models import CommitLogEntry, Topic
from apps.broker.services import consuming, delivery, registry, retention, sending, storage_usage
from apps.broker.services.sending import OutgoingMessage
from tests.conftest import db_url_for_tests
from tests.support.own_connection import in_thread
from tests.support.storage import counted, no_quota_published, truth
from tests.support.waiting import wait_until

__all__ = ["no_quota_published"]

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_quota_published"),
]

BOUND = 30  # seconds any one step may take (a bound, not a measurement)
PROMPT = 5  # seconds a step that waits for nothing may take (a bound)


@contextmanager
def measure_under_way(table: storage_usage.Table) -> Iterator[None]:
    """A third connection holds `table`'s measure lock as a measure reading it does."""
    with psycopg.connect(db_url_for_tests()) as measure:
        measure.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
            [storage_usage.MEASURE_LOCK, table.name],
        )
        yield
        measure.rollback()


def waiting_for_the_measure() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database() AND query LIKE '%%pg_advisory_xact_lock_shared%%' "
            "AND pid <> pg_backend_pid()"
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def send(topic: Topic, *, due_in: float | None = None) -> None:
    due = None if due_in is None else timezone.now() + timedelta(seconds=due_in)
    message = OutgoingMessage("shop", b"x" * 1000, body_is_binary=False)
    sending.message_send_batch(topic=topic, messages=[(message, due)])


def a_delayed_message_due(topic: Topic) -> None:
    send(topic, due_in=0.3)
    due = db_now() + timedelta(seconds=0.4)
    wait_until(lambda: db_now() > due, timeout=BOUND, interval=0.05)


@pytest.fixture
def orders() -> Topic:
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    return registry.topic_create(name="orders", queues=1)


def test_a_send_is_not_held_behind_a_delayed_delivery_waiting_for_the_measure(
    orders: Topic,
) -> None:
    a_delayed_message_due(orders)
    storage_usage.storage_measure()  # the measure's rows exist, as on any running txhub
    with measure_under_way(storage_usage.DELAYED):
        scan = in_thread(delivery.delayed_deliver_due)
        wait_until(waiting_for_the_measure, timeout=BOUND)
        # The send appends to the queue the delivery will append to: it waits for nobody.
        in_thread(lambda: send(orders)).result(timeout=PROMPT)
        assert not scan.done()
    assert scan.result(timeout=BOUND) == 1
    assert CommitLogEntry.objects.count() == 2


def test_a_delivery_that_waited_for_the_measure_is_counted_and_retention_keeps_the_sum(
    orders: Topic, settings: Any
) -> None:
    audit = registry.topic_create(name="audit", queues=1)
    a_delayed_message_due(orders)
    storage_usage.storage_measure()
    with measure_under_way(storage_usage.DELAYED):
        scan = in_thread(delivery.delayed_deliver_due)
        wait_until(waiting_for_the_measure, timeout=BOUND)
        # Rows committed meanwhile, and two beats measuring the other tables past them.
        send(audit)
        storage_usage.storage_measure()
        storage_usage.storage_measure()
    assert scan.result(timeout=BOUND) == 1
    storage_usage.storage_measure()
    storage_usage.storage_measure()
    assert truth()["shop"] >= 2 * 1000
    assert counted() == truth()

    settings.TXHUB_RETENTION = 60
    CommitLogEntry.objects.update(stored_at=timezone.now() - timedelta(hours=1))
    assert retention.retention_sweep()["commit_log"] == 2
    storage_usage.storage_measure()
    assert counted() == {"shop": 0}
    assert truth() == {}


def test_a_first_receive_is_not_held_behind_retention_waiting_for_the_measure(
    orders: Topic, settings: Any
) -> None:
    for _ in range(3):
        send(orders)
    storage_usage.storage_measure()
    settings.TXHUB_RETENTION = 60
    CommitLogEntry.objects.update(stored_at=timezone.now() - timedelta(hours=1))
    billing = registry.consumer_group_create(
        name="billing", max_delivery_attempts=16, consume_from="first"
    )
    with measure_under_way(storage_usage.COMMIT_LOG):
        sweep = in_thread(lambda: retention.retention_sweep(seconds=BOUND))
        wait_until(waiting_for_the_measure, timeout=BOUND)
        # The group's first receive from the topic makes its cursors: nothing holds it.
        received = in_thread(
            lambda: consuming.message_receive(
                group=billing, topic=orders, max_messages=10, invisible_seconds=60
            )
        ).result(timeout=PROMPT)
        assert len(received) == 3
    # The sweep then finds every row held by billing, which has not had them yet (0080).
    assert sweep.result(timeout=BOUND)["commit_log"] == 0
    assert CommitLogEntry.objects.count() == 3
