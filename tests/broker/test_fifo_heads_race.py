"""Receives of one FIFO consumer group racing for the heads an ack freed (services/fifo.py,
decision 0054): a head another receive is handing out is locked by it, and passed over at once
(SKIP LOCKED), neither waited for nor handed out a second time once that receive commits. The
mutation review of decision 0093 found no test that held to it. Real concurrent transactions,
each on its own connection; the thread's exception reaches the test through its future."""

import threading
import time
from datetime import datetime

from django.db import transaction

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


def test_a_head_being_handed_out_is_passed_over_by_another_receive(transactional_db: None) -> None:
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
