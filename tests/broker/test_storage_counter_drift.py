"""The storage counter (docs/decisions/0085, 0089, 0095) equals a full SUM of what each group
keeps: after a row whose transaction commits measures after taking its id, after a measure that
meets deletions under way, however steady, and after a concurrent mixed workload. The held
transactions are the real send and deletion code on connections of the test's own."""

import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from apps.broker.models import CommitLogEntry, Topic
from apps.broker.services import delivery, registry, retention, sending, storage_usage
from apps.broker.services.sending import OutgoingMessage
from tests.support.own_connection import in_thread
from tests.support.storage import counted, no_quota_published, truth

__all__ = ["no_quota_published"]

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_quota_published"),
]

BOUND = 30  # seconds any one step may take (a bound, not a measurement)
PROMPT = 5  # seconds a step that waits for nothing may take (a bound)


def send(topic: Topic, *, due_in: float | None = None) -> None:
    due = None if due_in is None else timezone.now() + timedelta(seconds=due_in)
    message = OutgoingMessage("shop", b"x" * 1000, body_is_binary=False)
    sending.message_send_batch(topic=topic, messages=[(message, due)])


@contextmanager
def held(work: Callable[[], object]) -> Iterator[Future[None]]:
    """`work` in a transaction of its own, on its own connection, held open (after `work`) until
    the block ends; the transaction then commits."""
    done_work, release = threading.Event(), threading.Event()

    def run() -> None:
        with transaction.atomic():
            work()
            done_work.set()
            assert release.wait(BOUND)

    future = in_thread(run)
    assert done_work.wait(BOUND) or future.result(timeout=0)
    try:
        yield future
    finally:
        release.set()
    future.result(timeout=BOUND)


def hold_deletion() -> None:
    """What a transaction deleting delayed messages takes first (a delivery, a recall)."""
    storage_usage.hold_measure(storage_usage.DELAYED)


@pytest.fixture
def orders() -> Topic:
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    return registry.topic_create(name="orders", queues=1)


def test_a_row_committed_measures_after_taking_its_id_is_counted_and_taken_off_once(
    orders: Topic, settings: Any
) -> None:
    audit = registry.topic_create(name="audit", queues=1)
    send(orders)
    storage_usage.storage_measure()
    with held(lambda: send(orders)):
        # Rows with higher ids committed meanwhile, and beats measuring past the held one's id.
        for _ in range(3):
            send(audit)
            storage_usage.storage_measure()
    storage_usage.storage_measure()
    storage_usage.storage_measure()
    assert CommitLogEntry.objects.count() == 5
    assert counted() == truth()

    settings.TXHUB_RETENTION = 60
    CommitLogEntry.objects.update(stored_at=timezone.now() - timedelta(hours=1))
    assert retention.retention_sweep()["commit_log"] == 5
    storage_usage.storage_measure()
    assert counted() == {"shop": 0}
    assert truth() == {}


def test_a_measure_waits_for_deletions_under_way_and_is_not_passed_by_the_next(
    orders: Topic,
) -> None:
    send(orders, due_in=3600)
    storage_usage.storage_measure()
    send(orders, due_in=3600)  # above what was measured: only a measure counts it
    release_second = threading.Event()

    def second_deletion() -> None:
        with transaction.atomic():
            hold_deletion()
            assert release_second.wait(BOUND)

    with held(hold_deletion):
        measuring = in_thread(storage_usage.storage_measure)
        time.sleep(0.5)
        # The next deletion begins before the first ends: deletions never stop.
        second = in_thread(second_deletion)
        time.sleep(0.5)
    try:
        # The first deletion has ended, the second has not: the measure is not kept waiting.
        assert measuring.result(timeout=PROMPT) == {}
        assert counted() == truth()
    finally:
        release_second.set()
        second.result(timeout=BOUND)


def test_the_counter_equals_a_full_sum_after_a_concurrent_mixed_workload(
    orders: Topic, settings: Any
) -> None:
    audit = registry.topic_create(name="audit", queues=1)
    settings.TXHUB_RETENTION = 1
    stop = threading.Event()
    rng = random.Random(95)
    # When each send committed, and when each deletion that deleted something returned.
    sent: list[float] = []
    delivered: list[float] = []
    swept: list[float] = []

    def sender(topic: Topic, delayed: bool) -> None:
        while not stop.is_set():
            with transaction.atomic():  # commits up to a few measures after taking its ids
                send(topic, due_in=0.2 if delayed else None)
                time.sleep(rng.uniform(0, 0.3))
            sent.append(time.monotonic())

    def deleter() -> None:
        while not stop.is_set():
            if delivery.delayed_deliver_due():
                delivered.append(time.monotonic())
            if retention.retention_sweep(seconds=PROMPT)["commit_log"]:
                swept.append(time.monotonic())

    def measurer() -> None:
        while not stop.is_set():
            storage_usage.storage_measure()
            time.sleep(0.05)

    work = [
        in_thread(lambda: sender(orders, delayed=False)),
        in_thread(lambda: sender(audit, delayed=True)),
        in_thread(deleter),
        in_thread(deleter),
        in_thread(measurer),
    ]
    time.sleep(4)
    stop.set()
    for future in work:
        future.result(timeout=BOUND)  # an exception in any thread fails the test here
    # Positive control (decision 0116): the workload was mixed. Delayed messages were delivered
    # and log rows swept while the senders still sent, not only before or after them.
    between = (min(sent), max(sent))
    assert any(between[0] < at < between[1] for at in delivered), (between, delivered)
    assert any(between[0] < at < between[1] for at in swept), (between, swept)
    storage_usage.storage_measure()
    storage_usage.storage_measure()
    assert truth()["shop"] > 0
    assert counted() == truth()
