"""The locks of check-back that no other test held to (found by the mutation review of decision
0093): the scan's claim passes over a row another transaction holds (SKIP LOCKED) instead of
waiting for it, and a check sent on a producer's stream holds the half's row from its last read
to its record, so a commit meanwhile lands after the check, never between (invariant 7), and the
producer's answer to the check waits for that record and is applied as check-back's answer. The
park scan counts, and its task logs, only the rows it parked: one a commit resolved between the
scan's read and its lock is left as it is (decision 0110)."""

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.db import transaction
from django.utils import timezone

from apps.broker import failpoints, tasks
from apps.broker.models import GrpcClient, HalfMessage, OpRecord, Resolver
from apps.broker.services import checkback, checkback_stream, clients, registry, transactions
from apps.broker.services.transactions import Actor
from tests.support.lock_waits import BOUND, until, waiting_for_a_lock
from tests.support.own_connection import in_thread
from tests.support.transactions import PRODUCER, make_due, make_group, prepare

CLIENT = "shop-host@102@0@producer"


def test_a_claim_passes_over_a_row_another_transaction_holds(transactional_db: None) -> None:
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    held, free = prepare(group, topic), prepare(group, topic)
    make_due(held, free)
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        # A resolution of `held` under way (a commit, an answer being applied).
        with transaction.atomic():
            HalfMessage.objects.select_for_update().get(pk=held.pk)
            locked.set()
            release.wait(timeout=10)

    holder = in_thread(hold)
    assert locked.wait(timeout=10)
    started = time.monotonic()
    try:
        claimed = checkback.checkback_claim_due()
        elapsed = time.monotonic() - started
    finally:
        release.set()
    holder.result(timeout=30)
    assert claimed == [free.pk]  # the held row is left for a later scan, not waited for
    assert elapsed < 2, elapsed


@pytest.fixture
def stream_process(transactional_db: None, settings: Any) -> Iterator[str]:
    """A gRPC process holding CLIENT's stream, as Redis and the database see it."""
    process = f"grpc-host-{time.monotonic_ns()}:4242"
    listener = redis.Redis.from_url(settings.CELERY_BROKER_URL).pubsub()  # type: ignore[no-untyped-call]
    listener.subscribe(checkback_stream.CHANNEL_PREFIX + process)
    assert listener.get_message(timeout=5)["type"] == "subscribe"
    try:
        yield process
    finally:
        listener.close()


def due_check_of_a_streaming_producer(process: str) -> HalfMessage:
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    token, _ = registry.token_create(name="rocketmq", scopes=[f"produce:{group.name}"])
    clients.client_seen(client_id=CLIENT, token_id=token.pk, client_type="PRODUCER", group="shop")
    clients.client_stream_opened(client_id=CLIENT, token_id=token.pk, process=process)
    half = prepare(group, topic)
    make_due(half)
    assert checkback.checkback_claim_due() == [half.pk]
    return half


@contextlib.contextmanager
def meanwhile(half: HalfMessage, work: Callable[[HalfMessage], Any]) -> Iterator[list[Future[Any]]]:
    """Runs `work` on a connection of its own as check-back sends its check (the failpoint
    `before_check_send`, armed in this process), giving it a second to finish (it waits for the
    half's lock if the check holds it); the check is sent after."""
    started: list[Future[Any]] = []

    def step() -> None:
        other = in_thread(lambda: work(half))
        started.append(other)
        with contextlib.suppress(TimeoutError):  # waiting for the half's row: as it should
            other.result(timeout=1)

    with failpoints.armed_here("before_check_send", step):
        yield started


def ops_of(half: HalfMessage) -> list[str]:
    return list(
        OpRecord.objects.filter(half_id=half.pk).order_by("id").values_list("op", flat=True)
    )


def test_a_commit_arriving_while_a_stream_check_is_sent_lands_after_the_checks_record(
    stream_process: str,
) -> None:
    half = due_check_of_a_streaming_producer(stream_process)
    with meanwhile(
        half,
        lambda half: transactions.transaction_commit(
            transaction_id=half.transaction_id, actor=PRODUCER
        ),
    ) as started:
        outcome = checkback.checkback_run(half_id=half.pk)
    [commit] = started
    commit.result(timeout=30)  # its exception, if any, fails the test here
    # The check went out while the transaction was PREPARED, and the commit came after it.
    assert ops_of(half) == ["PREPARE", "CHECK", "COMMIT"], outcome
    assert HalfMessage.objects.get(pk=half.pk).state == "COMMITTED"


def test_an_answer_arriving_while_its_check_is_sent_is_check_backs_answer(
    stream_process: str,
) -> None:
    half = due_check_of_a_streaming_producer(stream_process)
    token_id = GrpcClient.objects.get(client_id=CLIENT).token_id
    assert token_id is not None
    with meanwhile(
        half,
        lambda half: checkback_stream.checkback_answer(
            transaction_id=half.transaction_id,
            answer="COMMIT",
            client_id=CLIENT,
            token_id=token_id,
            producer=Actor(Resolver.PRODUCER, CLIENT),
            producer_groups=None,
        ),
    ) as started:
        checkback.checkback_run(half_id=half.pk)
    [answer] = started
    assert answer.result(timeout=30) == "COMMIT"  # not "producer": the check's record was seen
    committed = HalfMessage.objects.get(pk=half.pk)
    assert (committed.state, committed.resolved_by) == ("COMMITTED", "CHECK_BACK")


def test_a_row_committed_between_the_park_scans_read_and_its_lock_is_not_counted(
    transactional_db: None, caplog: pytest.LogCaptureFixture
) -> None:
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    committed, stale = prepare(group, topic), prepare(group, topic)
    HalfMessage.objects.filter(pk__in=[committed.pk, stale.pk]).update(
        born_at=timezone.now() - timedelta(hours=100)
    )
    locked, go = threading.Event(), threading.Event()

    def commit_holding_its_lock() -> None:
        # The producer's commit, begun before the scan reaches the row and done while it waits.
        with transaction.atomic():
            HalfMessage.objects.select_for_update().get(pk=committed.pk)
            locked.set()
            assert go.wait(timeout=BOUND)
            transactions.transaction_commit(transaction_id=committed.transaction_id, actor=PRODUCER)

    holder = in_thread(commit_holding_its_lock)
    assert locked.wait(timeout=BOUND)
    caplog.set_level(logging.INFO, logger=tasks.logger.name)
    scan = in_thread(tasks.checkback_scan)
    try:
        # The scan has read both stale rows and waits for the committing one's lock.
        assert until(lambda: waiting_for_a_lock("FOR UPDATE OF h"))
    finally:
        go.set()
    holder.result(timeout=30)
    assert scan.result(timeout=30) == 0  # nothing was left to claim for a check
    assert HalfMessage.objects.get(pk=committed.pk).state == "COMMITTED"
    assert HalfMessage.objects.get(pk=stale.pk).state == "PARKED"
    assert ops_of(committed) == ["PREPARE", "COMMIT"]
    said = [r.getMessage() for r in caplog.records if r.name == tasks.logger.name]
    assert said == ["checkback_scan: claimed 0, parked 1"], said
