"""Receives of one FIFO consumer group racing for the heads an ack freed (services/fifo.py,
decision 0054): a head another receive is handing out is locked by it, and passed over at once
(SKIP LOCKED), neither waited for nor handed out a second time once that receive commits. The
mutation review of decision 0093 found no test that held to it. Real concurrent transactions,
each on its own connection; the thread's exception reaches the test through its future."""

import threading
import time
from datetime import datetime

from django.db import transaction

from apps.broker import failpoints
from apps.broker.models import ConsumerGroup, Delivery, Topic
from apps.broker.services import consuming, registry, sending
from apps.broker.services.sending import OutgoingMessage
from tests.support.own_connection import in_thread

GROUPS = 4  # message groups, each with a head in flight and a message held behind it
BOUND = 30  # seconds a step may take (a bound, not a measurement)


def receive(group: ConsumerGroup, topic: Topic, most: int = GROUPS) -> list[consuming.Received]:
    return consuming.message_receive(
        group=group, topic=topic, max_messages=most, invisible_seconds=60
    )


def ack_all(group: ConsumerGroup, received: list[consuming.Received]) -> None:
    handles = [f"{r.delivery.pk}.{r.delivery.handle_token}" for r in received]
    assert consuming.message_ack(group=group, receipt_handles=handles) == (handles, [])


def heads_freed_by_an_ack() -> tuple[Topic, ConsumerGroup]:
    """A FIFO group whose first message of each message group was received and acked: every
    group's second message is a HELD head, free to hand out."""
    topic = registry.topic_create(name="orders", queues=1)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    group = registry.consumer_group_create(
        name="billing", max_delivery_attempts=16, consume_from="first", fifo=True
    )
    messages: list[tuple[OutgoingMessage, datetime | None]] = [
        (OutgoingMessage("shop", f"{g}-{i}".encode(), False, message_group=f"g{g}"), None)
        for i in range(2)
        for g in range(GROUPS)
    ]
    sending.message_send_batch(topic=topic, messages=messages)
    heads = receive(group, topic, most=2 * GROUPS)
    assert len(heads) == GROUPS  # the first of each group; the second is held behind it
    assert Delivery.objects.filter(state="HELD").count() == GROUPS
    ack_all(group, heads)  # every group's second message is free now
    return topic, group


def test_a_head_being_handed_out_is_passed_over_by_another_receive(transactional_db: None) -> None:
    topic, group = heads_freed_by_an_ack()
    released, commit = threading.Event(), threading.Event()

    def receive_and_commit_when_told() -> list[consuming.Received]:
        with transaction.atomic():
            got = receive(group, topic)
            released.set()
            assert commit.wait(timeout=BOUND)
        return got

    first = in_thread(receive_and_commit_when_told)
    assert released.wait(timeout=BOUND)
    # The first receive has not committed: its heads are locked. A second one in the meantime
    # takes none of them; were it to wait for them, the timer's commit would let it through.
    timer = threading.Timer(1, commit.set)
    timer.start()
    try:
        started = time.monotonic()
        second = receive(group, topic)
        waited = time.monotonic() - started
    finally:
        commit.set()
        timer.cancel()
    got = first.result(timeout=BOUND)
    assert sorted(bytes(r.message.body).decode() for r in got) == [f"{g}-1" for g in range(GROUPS)]
    assert second == []
    assert waited < 0.5, waited  # passed over, not waited for
    ack_all(group, got)  # every handle the first receive gave is live: none was taken over


def test_a_head_another_receive_handed_out_after_the_heads_read_is_not_handed_out_again(
    transactional_db: None,
) -> None:
    """The release re-checks `state = 'HELD'` under the row's lock: a receive that read the heads
    while they were held, and locks them after another receive handed them out and committed,
    finds them in flight and hands out none of them (mutation 30 of decision 0093)."""
    topic, group = heads_freed_by_an_ack()
    other: list[list[consuming.Received]] = []
    late_receive = threading.get_ident()

    def another_receive_commits() -> None:
        if threading.get_ident() == late_receive:  # the other one passes the site straight on
            other.append(in_thread(lambda: receive(group, topic)).result(timeout=BOUND))

    with failpoints.armed_here("after_fifo_heads_read", another_receive_commits):
        late = receive(group, topic)
    [first] = other
    assert sorted(bytes(r.message.body).decode() for r in first) == [
        f"{g}-1" for g in range(GROUPS)
    ]
    assert late == []
    ack_all(group, first)  # the first receive's handles are live: none was taken over
