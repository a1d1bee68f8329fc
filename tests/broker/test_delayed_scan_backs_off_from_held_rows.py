"""A delayed-delivery scan that finds every due row held by another scan (FOR UPDATE SKIP LOCKED
passes over them, services/delivery.py) leaves them to it and asks again after a pause that
grows, not every few milliseconds, and ends at its span's end (it went on as long as the rows
were held: decision 0115). The other scan is a transaction of the test's own, on its own
connection, holding the due rows as a scan's read does; the scan runs in a thread on its own
connection, where its queries are counted."""

from datetime import timedelta
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.broker.models import CommitLogEntry, DelayedMessage
from apps.broker.services import delivery, registry, sending
from apps.broker.services.sending import OutgoingMessage
from tests.support.own_connection import in_thread
from tests.support.statement_faults import own_connection

DUE = 4
SPAN = 1.0  # seconds the scan keeps delivering, as a beat's scan does
BOUND = 10.0  # seconds past its span the scan may take to end (a bound, not a measurement)
# Its reads of the due rows while they are held: the growing pauses up to the longest, then one
# per longest pause (a 5 ms poll made about two hundred).
MOST_READS = 6 + SPAN / delivery.HELD_PAUSE_MOST


def due_messages(count: int) -> None:
    topic = registry.topic_create(name="orders", queues=2)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    later = timezone.now() + timedelta(hours=1)
    messages: list[tuple[OutgoingMessage, Any]] = [
        (OutgoingMessage("shop", f"m{n}".encode(), body_is_binary=False), later)
        for n in range(count)
    ]
    sending.message_send_batch(topic=topic, messages=messages)
    DelayedMessage.objects.update(deliver_at=timezone.now() - timedelta(seconds=1))


def scan_counting_its_due_reads() -> tuple[int, int]:
    """A scan's span: what it moved, and how often it read the due rows."""
    with CaptureQueriesContext(connection) as queries:
        moved = delivery.delayed_deliver_for(seconds=SPAN)
    return moved, sum("SKIP LOCKED" in q["sql"] for q in queries.captured_queries)


def test_a_scan_backs_off_while_another_holds_every_due_row(transactional_db: None) -> None:
    due_messages(DUE)
    holder = own_connection(autocommit=False)
    try:
        held = holder.execute("SELECT id FROM broker_delayedmessage FOR UPDATE").fetchall()
        assert len(held) == DUE
        moved, reads = in_thread(scan_counting_its_due_reads).result(timeout=SPAN + BOUND)
    finally:
        holder.close()  # the other scan ends, its rows let go
    assert moved == 0
    assert 1 <= reads <= MOST_READS, reads
    # Let go, they are delivered at once, none lost.
    assert delivery.delayed_deliver_for(seconds=SPAN) == DUE
    assert CommitLogEntry.objects.count() == DUE
