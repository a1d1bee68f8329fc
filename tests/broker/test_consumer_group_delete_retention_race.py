"""A consumer group deleted while the retention sweep deletes the log rows it has acked
(services/registry.py, retention.py; decisions 0080 and 0088): neither deadlocks. The deletion
holds each topic it read with the sweep's advisory lock, shared, so the sweep leaves the topic's
rows to its next run (or the deletion waits for the sweep's page) rather than meet it row by row.

Without that lock (mutation 27 of decision 0093) the two DELETEs of the group's acked deliveries
cross: the deletion's in the table's order, the sweep's in its unique index's order (message by
message), which is the planner's choice on a table of long history. Three old messages A, M, B,
acked B first so that the table holds their rows B, M, A: the deletion takes B, the sweep takes
A, a test connection holding M stops both until each holds the row the other wants next. Real
concurrent transactions, each on its own connection; every thread's exception reaches the test
through its future."""

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from threading import Event

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.broker.models import CommitLogEntry, ConsumerGroup, Delivery
from apps.broker.services import consuming, registry, retention, sending
from apps.broker.services.sending import OutgoingMessage
from tests.support.lock_waits import BOUND, until, waiting_for_a_lock
from tests.support.own_connection import on_own_connection

pytestmark = pytest.mark.django_db(transaction=True)

# How long the deletion and the sweep may take once the middle row goes: past the test sessions'
# deadlock_timeout (10 s, tests/conftest.py), so that a deadlock is reported as one.
FINISH = 30


def acked_out_of_order() -> tuple[ConsumerGroup, int]:
    """The group `billing`, the only one, with A, M, B stored in that order, older than the
    retention and acked B, M, A. Returns the group and M's delivery id."""
    topic = registry.topic_create(name="orders", queues=1)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    group = registry.consumer_group_create(
        name="billing", max_delivery_attempts=16, consume_from="first"
    )
    message = OutgoingMessage("shop", b"x", body_is_binary=False)
    sending.message_send_batch(topic=topic, messages=[(message, None)] * 3)
    got = consuming.message_receive(group=group, topic=topic, max_messages=3, invisible_seconds=60)
    a, m, b = sorted(got, key=lambda r: r.delivery.pk)
    for received in (b, m, a):  # each ack stores the row's new version after the last one
        handle = received.receipt_handle
        assert consuming.message_ack(group=group, receipt_handles=[handle]) == ([handle], [])
    long_ago = timezone.now() - timedelta(seconds=settings.TXHUB_RETENTION + 3600)
    assert CommitLogEntry.objects.update(stored_at=long_ago) == 3
    return group, m.delivery.pk


def test_the_retention_sweep_and_a_deletion_of_a_group_do_not_deadlock() -> None:
    group, middle = acked_out_of_order()
    middle_held, release = Event(), Event()

    def hold_the_middle_row() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM broker_delivery WHERE id = %s FOR KEY SHARE", [middle])
            middle_held.set()
            assert release.wait(BOUND)

    def sweep_by_the_index() -> dict[str, int]:
        # The plan of a table of long history: the deliveries by delivery_unique, in its order.
        with connection.cursor() as cursor:
            cursor.execute("SET enable_seqscan = off")
            cursor.execute("SET enable_bitmapscan = off")
        return retention.retention_sweep(seconds=BOUND)

    with ThreadPoolExecutor(3) as pool:
        holder = pool.submit(on_own_connection(hold_the_middle_row))
        assert middle_held.wait(BOUND)
        deletion = pool.submit(
            on_own_connection(lambda: registry.consumer_group_delete(name="billing"))
        )
        assert until(lambda: waiting_for_a_lock("WITH gone AS (DELETE"))  # B taken, M waited for
        sweep = pool.submit(on_own_connection(sweep_by_the_index))
        # The sweep took A and waits for M, or (fixed) leaves the topic to its next run.
        assert until(lambda: waiting_for_a_lock("WHERE message_id = ANY") or sweep.done())
        release.set()
        holder.result(timeout=BOUND)
        gone = deletion.result(timeout=FINISH)  # re-raises a deadlock
        swept = sweep.result(timeout=FINISH)
    assert gone == {"acked": 3}
    assert swept["commit_log"] == 0  # the next run deletes them
    assert not ConsumerGroup.objects.filter(pk=group.pk).exists()
    assert not Delivery.objects.exists()
    assert retention.retention_sweep(seconds=BOUND)["commit_log"] == 3
