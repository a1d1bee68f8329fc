"""The delayed delivery scan appends its due messages queue by queue in (topic, queue) order, the
order every appending transaction takes queue rows in (services/delivery.py, decision 0068), so
a scan and a send batch crossing the same queues queue up instead of deadlocking. In the order
the messages fell due (mutation 15 of decision 0093) the scan takes queue 2 first when its
message fell due first, while the batch takes queue 1 first, and each then waits for the other.

The interleaving is made at the database (decision 0098): each insert into the commit log waits,
in a trigger of the test's own, for an advisory lock that a session of the test holds, so each
transaction stops once it holds its first queue's row. The test lets the lock go once both
wait, as pg_stat_activity shows. Real concurrent transactions, each on its own connection; each
thread's exception reaches the test through its future."""

import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import psycopg
import pytest
from django.utils import timezone

from apps.broker.models import CommitLogEntry, DelayedMessage
from apps.broker.services import delivery, registry, sending
from apps.broker.services.sending import OutgoingMessage
from tests.support.killed_mid_write import SECONDS, inserts_wait
from tests.support.own_connection import in_thread
from tests.support.statement_faults import own_connection

# The advisory lock each insert into the commit log waits for while the test holds it.
STEP = 0x7478_6840


@pytest.fixture
def wait_in_commit_log_insert(transactional_db: None) -> Iterator[None]:
    """A row trigger: it fires once the row's queue row is taken (the insert reads its offset
    from the statement's update of that row), so the transaction waits holding it."""
    with inserts_wait("broker_commitlogentry", STEP, name="delayed_order_test_wait"):
        yield


def message_id(queue: int, n: int) -> str:
    """A message id (hex) that lands on `queue` of a topic with four queues."""
    return f"{n * 4 + queue:032X}"


def wait_until_both_wait(holder: psycopg.Connection) -> None:
    """Until two sessions wait for a lock, one of them for `holder`'s: in the (topic, queue)
    order, one waits for `holder` and the other for that one's first queue row; in the order
    due, both wait for `holder`, each holding a queue row the other takes next."""
    with own_connection(autocommit=True) as watcher:
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            waits = [
                row[0]
                for row in watcher.execute(
                    "SELECT pg_blocking_pids(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND cardinality(pg_blocking_pids(pid)) > 0"
                ).fetchall()
            ]
            if len(waits) == 2 and any(holder.info.backend_pid in pids for pids in waits):
                return
            time.sleep(0.02)
    raise AssertionError("the scan and the batch never both waited")


def test_a_scan_and_a_send_batch_crossing_two_queues_both_store(
    wait_in_commit_log_insert: None,
) -> None:
    topic = registry.topic_create(name="orders", queues=4)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    message = OutgoingMessage("shop", b"x", body_is_binary=False)
    later = timezone.now() + timedelta(hours=1)
    delayed: list[tuple[OutgoingMessage, datetime | None]] = [(message, later), (message, later)]
    sending.message_send_batch(
        topic=topic, messages=delayed, msg_ids=[message_id(1, 1), message_id(2, 2)]
    )
    # Due now, queue 2's message first: in the order due, the scan would take queue 2 first.
    now = timezone.now()
    for queue, ago in ((1, 1), (2, 2)):
        due = now - timedelta(minutes=ago)
        assert DelayedMessage.objects.filter(queue_id=queue).update(deliver_at=due) == 1
    batch = [message_id(1, 3), message_id(2, 4)]  # queue 1, then queue 2

    with own_connection(autocommit=False) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", [STEP])
        scan = in_thread(delivery.delayed_deliver_due)
        send = in_thread(
            lambda: sending.message_send_batch(
                topic=topic, messages=[(message, None)] * 2, msg_ids=batch
            )
        )
        try:
            wait_until_both_wait(holder)
        finally:
            holder.rollback()  # the lock goes: each goes on to its second queue
        moved = scan.result(timeout=SECONDS)  # re-raises a deadlock
        sent = send.result(timeout=SECONDS)
    assert moved == 2
    assert [s.queue_id for s in sent] == [1, 2]
    assert not DelayedMessage.objects.exists()
    assert sorted(CommitLogEntry.objects.values_list("queue_id", flat=True)) == [1, 1, 2, 2]
