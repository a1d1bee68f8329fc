"""Two delayed-delivery scans at once (a beat on each machine of run-ha, a slow scan overlapping
the next tick, an operator's manual run): each locks the due rows it reads and passes over the
ones the other holds (FOR UPDATE SKIP LOCKED, services/delivery.py), so the two read at the same
time, neither waits for the other, and every due message lands in the commit log exactly once.

The scans meet at the `after_delayed_due_read` failpoint (decision 0098): neither goes on to
append until both have read their due rows. Without the row lock both read the same rows and
append them twice; without SKIP LOCKED the second waits in its read for the first, which never
comes to the meeting (decision 0104). Real concurrent transactions, each on its own connection;
each thread's exception reaches the test through its future."""

import threading
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from apps.broker import failpoints
from apps.broker.models import CommitLogEntry, DelayedMessage
from apps.broker.services import delivery, registry, sending
from apps.broker.services.sending import OutgoingMessage
from tests.support.own_connection import in_thread

BATCH = 6  # due rows one scan reads at a time
DUE = 2 * BATCH  # one batch for each scan: both have something to append
MEET = 10.0  # seconds a scan waits at the meeting for the other (a bound, not a measurement)


def due_messages(count: int) -> set[str]:
    """`count` delayed messages on both queues of a topic, all due, each a second apart: their
    ids."""
    topic = registry.topic_create(name="orders", queues=2)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    later = timezone.now() + timedelta(hours=1)
    messages: list[tuple[OutgoingMessage, datetime | None]] = [
        (OutgoingMessage("shop", f"m{n}".encode(), body_is_binary=False), later)
        for n in range(count)
    ]
    sent = sending.message_send_batch(topic=topic, messages=messages)
    assert {s.queue_id for s in sent} == {0, 1}
    now = timezone.now()
    for n, each in enumerate(sent):
        due = now - timedelta(seconds=count - n)
        assert DelayedMessage.objects.filter(msg_id=each.msg_id).update(deliver_at=due) == 1
    return {s.msg_id for s in sent}


def test_two_scans_that_both_read_their_due_rows_deliver_each_message_once(
    transactional_db: None, settings: Any
) -> None:
    settings.TXHUB_DELIVERY_BATCH = BATCH
    msg_ids = due_messages(DUE)
    meeting = threading.Barrier(2)

    def meet() -> None:
        try:
            meeting.wait(timeout=MEET)
        except threading.BrokenBarrierError:
            raise AssertionError(
                "the two scans never held their due rows at the same time: one of them waited "
                "in its read for the rows the other had locked"
            ) from None

    with failpoints.armed_here("after_delayed_due_read", meet):
        scans = [in_thread(delivery.delayed_deliver_due) for _ in range(2)]
        moved = [scan.result(timeout=3 * MEET) for scan in scans]  # re-raises a scan's error

    # Each scan moved a batch of its own: the second passed over the first's rows.
    assert sorted(moved) == [BATCH, BATCH]
    delivered = Counter(CommitLogEntry.objects.values_list("msg_id", flat=True))
    assert [msg_id for msg_id, times in delivered.items() if times > 1] == []  # no duplicate
    assert set(delivered) == msg_ids  # none lost
    assert not DelayedMessage.objects.exists()  # none left due
    for queue in (0, 1):  # each queue's offsets dense, none given twice
        offsets = list(
            CommitLogEntry.objects.filter(queue_id=queue)
            .order_by("queue_offset")
            .values_list("queue_offset", flat=True)
        )
        assert offsets == list(range(len(offsets))), (queue, offsets)
