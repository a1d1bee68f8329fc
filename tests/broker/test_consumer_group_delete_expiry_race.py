"""A consumer group deleted while the periodic expiry scan runs (docs/decisions/0088): neither
deadlocks. The deletion's DELETE reaches the group's deliveries in the table's order; the scan's
UPDATE in its in-flight index's order (by when each delivery became visible again), which is
what the planner chooses on a table of mostly acked history. Two expired deliveries A and B,
stored A first but B visible first, are taken in opposite orders: deletion A then B, scan B then
A. A third row between them, held by a test connection, stops the deletion after A until the
scan has taken B. Real concurrent transactions, each on its own connection; every thread's
exception reaches the test through its future."""

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from threading import Event

import pytest
from django.db import connection, transaction
from django.utils import timezone

from apps.broker.models import ConsumerGroup, Delivery, DeliveryState
from apps.broker.services import consuming, dead_letters, registry, sending
from apps.broker.services.sending import OutgoingMessage
from tests.support.lock_waits import BOUND, until, waiting_for_a_lock
from tests.support.own_connection import on_own_connection

pytestmark = pytest.mark.django_db(transaction=True)


def expired_out_of_order() -> tuple[ConsumerGroup, int]:
    """The group `billing` with A, M, B stored in that order: A and B expired and exhausted (B
    visible again before A), M acked. Returns the group and M's id."""
    topic = registry.topic_create(name="orders", queues=1)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    group = registry.consumer_group_create(
        name="billing", max_delivery_attempts=1, consume_from="first"
    )
    message = OutgoingMessage("shop", b"x", body_is_binary=False)
    sending.message_send_batch(topic=topic, messages=[(message, None)] * 3)
    got = consuming.message_receive(group=group, topic=topic, max_messages=3, invisible_seconds=60)
    a, m, b = sorted(r.delivery.pk for r in got)
    now = timezone.now()
    # Updated in this order, their new row versions are stored A, M, B.
    Delivery.objects.filter(pk=a).update(invisible_until=now - timedelta(minutes=1))
    Delivery.objects.filter(pk=m).update(state=DeliveryState.ACKED)
    Delivery.objects.filter(pk=b).update(invisible_until=now - timedelta(minutes=2))
    return group, m


def test_the_expiry_scan_and_a_deletion_of_one_of_its_groups_do_not_deadlock() -> None:
    group, middle = expired_out_of_order()
    middle_held, release = Event(), Event()

    def hold_the_middle_row() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM broker_delivery WHERE id = %s FOR KEY SHARE", [middle])
            middle_held.set()
            assert release.wait(BOUND)

    def expire_by_the_index() -> int:
        # The plan of a table of mostly acked history: the in-flight index, in its order.
        with connection.cursor() as cursor:
            cursor.execute("SET enable_seqscan = off")
        return dead_letters.deliveries_expire()

    with ThreadPoolExecutor(3) as pool:
        holder = pool.submit(on_own_connection(hold_the_middle_row))
        assert middle_held.wait(BOUND)
        deletion = pool.submit(
            on_own_connection(lambda: registry.consumer_group_delete(name="billing"))
        )
        assert until(lambda: waiting_for_a_lock("WITH gone AS (DELETE"))  # A taken, M waited for
        expiry = pool.submit(on_own_connection(expire_by_the_index))
        # The scan took B and waits for A, or (fixed) keeps clear of the group being deleted.
        assert until(lambda: waiting_for_a_lock("WITH dead AS") or expiry.done())
        release.set()
        holder.result(timeout=BOUND)
        gone = deletion.result(timeout=BOUND)
        expired = expiry.result(timeout=BOUND)
    assert gone == {"acked": 1, "inflight": 2}
    assert expired == 0
    assert not ConsumerGroup.objects.filter(pk=group.pk).exists()
    assert not Delivery.objects.filter(group_id=group.pk).exists()
