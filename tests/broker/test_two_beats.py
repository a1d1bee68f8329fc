"""Two or three Celery beats at once (one per machine, docs/decisions/0044): every scan they
trigger claims its rows, so scans running together never deliver or expire a row twice.
(Check-back claims: tests/broker/test_checkback.py, test_concurrent_scans_never_claim_...)"""

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from apps.broker.models import CommitLogEntry, DelayedMessage, Delivery, DeliveryState
from apps.broker.services import consuming, dead_letters, delivery, registry, sending, transactions
from tests.support.transactions import PRODUCER, make_group, prepare

SCANS = 3  # three machines, a beat on each


def together(scan: Callable[[], int]) -> list[int]:
    """`scan` run by SCANS threads released at once, each on its own connection."""
    barrier = threading.Barrier(SCANS)

    def run() -> int:
        try:
            barrier.wait(timeout=30)
            return scan()
        finally:
            connection.close()

    with ThreadPoolExecutor(SCANS) as pool:
        futures = [pool.submit(run) for _ in range(SCANS)]
        return [future.result(timeout=120) for future in futures]


def test_delayed_messages_are_delivered_once_by_scans_running_together(
    transactional_db: None, settings: Any
) -> None:
    settings.TXHUB_DELIVERY_BATCH = 7  # many small claims, so the scans interleave
    topic = registry.topic_create(name="orders", queues=2)
    group = make_group(name="shop")
    later = timezone.now() + timedelta(hours=1)
    for n in range(60):
        sending.message_send(
            topic=topic,
            message=sending.OutgoingMessage(
                producer_group=group.name, body=f"m{n}".encode(), body_is_binary=False
            ),
            deliver_at=later,
        )
    DelayedMessage.objects.update(deliver_at=timezone.now() - timedelta(seconds=1))

    def scan_until_empty() -> int:
        moved = 0
        while batch := delivery.delayed_deliver_due():
            moved += batch
        return moved

    moved = together(scan_until_empty)
    assert sum(moved) == 60
    bodies = [bytes(body) for body in CommitLogEntry.objects.values_list("body", flat=True)]
    assert sorted(bodies) == sorted(f"m{n}".encode() for n in range(60))  # each exactly once
    assert not DelayedMessage.objects.exists()


def test_exhausted_deliveries_are_dead_lettered_once_by_scans_running_together(
    transactional_db: None,
) -> None:
    topic = registry.topic_create(name="orders", queues=1)
    group = make_group(name="shop")
    billing = registry.consumer_group_create(
        name="billing", max_delivery_attempts=1, consume_from="first"
    )
    for _ in range(40):
        half = prepare(group, topic)
        transactions.transaction_commit(transaction_id=half.transaction_id, actor=PRODUCER)
    consuming.message_receive(group=billing, topic=topic, max_messages=32, invisible_seconds=60)
    consuming.message_receive(group=billing, topic=topic, max_messages=32, invisible_seconds=60)
    Delivery.objects.update(invisible_until=timezone.now() - timedelta(seconds=1))

    expired = together(dead_letters.deliveries_expire)
    assert sum(expired) == 40  # each row dead-lettered by exactly one of the scans
    assert Delivery.objects.filter(state=DeliveryState.DLQ).count() == 40
