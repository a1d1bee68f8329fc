"""A consumer group deleted while its receives run (docs/decisions/0088): a receive under way
finishes first and the deletion then removes what it wrote; a receive that starts while the
deletion runs waits for it and is told the group is gone. Never a foreign-key error at a commit
(a 500), never a row left that names the deleted group. Real concurrent transactions, each on its
own connection; every thread's exception reaches the test through its future."""

import time
from concurrent.futures import Future, ThreadPoolExecutor
from threading import Event
from typing import Any

import pytest
from django.db import connection, transaction

from apps.broker.models import ConsumerGroup, Topic
from apps.broker.services import consuming, registry, sending
from apps.broker.services.errors import NotFound
from apps.broker.services.sending import OutgoingMessage
from tests.support.own_connection import on_own_connection

pytestmark = pytest.mark.django_db(transaction=True)

BOUND = 10  # seconds a step may take (a bound, not a measurement)


@pytest.fixture(autouse=True, params=[False, True], ids=["no-flush", "synchronous"])
def receive_commit(request: pytest.FixtureRequest, settings: Any) -> None:
    """Both statements a receive may hold its group with (group_locks.py): the single node's,
    which skips the WAL flush, and a replicated cluster's (TXHUB_RECEIVE_SYNCHRONOUS_COMMIT)."""
    settings.TXHUB_RECEIVE_SYNCHRONOUS_COMMIT = request.param


def setup() -> tuple[Topic, ConsumerGroup]:
    topic = registry.topic_create(name="orders", queues=2)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    group = registry.consumer_group_create(
        name="billing", max_delivery_attempts=16, consume_from="first"
    )
    message = OutgoingMessage("shop", b"x", body_is_binary=False)
    sending.message_send_batch(topic=topic, messages=[(message, None)] * 4)
    return topic, group


def receive(group: ConsumerGroup, topic: Topic) -> list[consuming.Received]:
    return consuming.message_receive(group=group, topic=topic, max_messages=2, invisible_seconds=60)


def rows_naming(group_id: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM broker_consumercursor WHERE group_id = %(g)s)"
            " + (SELECT count(*) FROM broker_delivery WHERE group_id = %(g)s)"
            " + (SELECT count(*) FROM broker_consumergroup_topics WHERE consumergroup_id = %(g)s)"
            " + (SELECT count(*) FROM broker_consumergroup WHERE id = %(g)s)",
            {"g": group_id},
        )
        return int(cursor.fetchone()[0])


def still_running(future: Future[Any], seconds: float = 0.5) -> bool:
    time.sleep(seconds)
    return not future.done()


def test_a_receive_under_way_finishes_before_the_deletion_which_then_removes_its_rows() -> None:
    topic, group = setup()
    received, release = Event(), Event()

    def first_receive_held_open() -> int:
        # The group's first receive (it makes its cursors and deliveries), its transaction kept
        # open until the test says: a receive caught in the middle.
        with transaction.atomic():
            got = receive(group, topic)
            received.set()
            assert release.wait(BOUND)
        return len(got)

    with ThreadPoolExecutor(2) as pool:
        receiving = pool.submit(on_own_connection(first_receive_held_open))
        assert received.wait(BOUND)
        deleting = pool.submit(
            on_own_connection(lambda: registry.consumer_group_delete(name="billing"))
        )
        try:
            assert still_running(deleting), "the deletion did not wait for the receive"
        finally:
            release.set()
        assert receiving.result(BOUND) == 2  # committed: no foreign-key error at its commit
        assert deleting.result(BOUND) == {"inflight": 2}
    assert rows_naming(group.pk) == 0


def test_a_receive_that_starts_during_the_deletion_waits_and_is_told_the_group_is_gone() -> None:
    topic, group = setup()
    with ThreadPoolExecutor(1) as pool, transaction.atomic():
        registry.consumer_group_delete(name="billing")
        # The deletion is not committed yet: the receive (which read its group before) waits.
        receiving = pool.submit(on_own_connection(lambda: receive(group, topic)))
        assert still_running(receiving), "the receive did not wait for the deletion"
        # Leaving the block commits the deletion.
    with pytest.raises(NotFound):
        receiving.result(BOUND)
    assert rows_naming(group.pk) == 0


def test_receives_and_acks_in_a_loop_meet_a_deletion_with_no_error_but_not_found() -> None:
    topic, group = setup()
    started, stop = Event(), Event()

    def consume_until_told() -> int:
        rounds = 0
        while not stop.is_set():
            try:
                got = receive(group, topic)
                consuming.message_ack(
                    group=group, receipt_handles=[r.receipt_handle for r in got[:1]]
                )
            except NotFound:
                return rounds  # the group is gone: what a consumer is told
            rounds += 1
            started.set()
        raise AssertionError("the consumer was never told its group is gone")

    with ThreadPoolExecutor(3) as pool:
        consumers = [pool.submit(on_own_connection(consume_until_told)) for _ in range(3)]
        assert started.wait(BOUND)
        try:
            registry.consumer_group_delete(name="billing")
            deadline = time.monotonic() + BOUND
            while time.monotonic() < deadline and not all(c.done() for c in consumers):
                time.sleep(0.05)
        finally:
            stop.set()
        assert all(c.result(BOUND) >= 0 for c in consumers)  # raises a consumer's exception
    assert rows_naming(group.pk) == 0


def test_a_receive_is_not_held_behind_a_change_of_the_groups_topics() -> None:
    """A binding change locks the group's row against another change, not against its receives
    (their FOR KEY SHARE, decision 0089): they go on while it runs."""
    topic, group = setup()
    changing, release = Event(), Event()

    def change_held_open() -> None:
        with transaction.atomic():
            registry.consumer_group_bind_topics(name="billing", topics=["orders"])
            changing.set()
            assert release.wait(BOUND)

    with ThreadPoolExecutor(2) as pool:
        change = pool.submit(on_own_connection(change_held_open))
        assert changing.wait(BOUND)
        receiving = pool.submit(on_own_connection(lambda: receive(group, topic)))
        try:
            assert len(receiving.result(5)) == 2, "the receive waited for the binding change"
        finally:
            release.set()
        change.result(BOUND)
    assert list(ConsumerGroup.objects.get(pk=group.pk).topics.values_list("name", flat=True)) == [
        "orders"
    ]
