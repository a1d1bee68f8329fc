"""Retention: resolved transactions (with their op records) and commit-log rows (with their
deliveries) older than TXHUB_RETENTION go, a row only once every group has had it (decision
0080); nothing unresolved is ever touched."""

from datetime import timedelta

from django.utils import timezone

from apps.broker.models import CommitLogEntry, Delivery, HalfMessage, OpRecord, Resolver
from apps.broker.services import consuming, registry, retention, transactions
from apps.broker.services.sending import OutgoingMessage
from apps.broker.services.transactions import Actor

PRODUCER = Actor(Resolver.PRODUCER, "test")


def test_old_resolved_work_is_deleted_and_unresolved_work_is_kept(db: None) -> None:
    topic = registry.topic_create(name="orders", queues=1)
    group = registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    consumers = registry.consumer_group_create(
        name="billing", max_delivery_attempts=16, consume_from="first"
    )
    message = OutgoingMessage(producer_group="shop", body=b"x", body_is_binary=False)

    def prepare() -> HalfMessage:
        return transactions.transaction_prepare(
            producer_group=group, topic=topic, message=message, actor=PRODUCER
        )

    old_done, old_pending, old_parked, young_done = prepare(), prepare(), prepare(), prepare()
    for half in (old_done, young_done):
        transactions.transaction_commit(transaction_id=half.transaction_id, actor=PRODUCER)
    transactions.transaction_park(
        transaction_id=old_parked.transaction_id, actor=PRODUCER, reason="test"
    )
    received = consuming.message_receive(
        group=consumers, topic=topic, max_messages=10, invisible_seconds=60
    )
    long_ago = timezone.now() - timedelta(hours=73)
    HalfMessage.objects.filter(pk__in=[old_done.pk, old_pending.pk, old_parked.pk]).update(
        born_at=long_ago, resolved_at=long_ago
    )
    HalfMessage.objects.filter(pk=old_pending.pk).update(resolved_at=None)
    CommitLogEntry.objects.filter(transaction_id=old_done.transaction_id).update(stored_at=long_ago)

    # The old row is received but not acked: billing has not had it yet (decision 0080).
    assert retention.retention_sweep() == swept(half_messages=1, commit_log=0)
    assert set(HalfMessage.objects.values_list("pk", flat=True)) == {
        old_pending.pk,
        old_parked.pk,
        young_done.pk,
    }
    assert not OpRecord.objects.filter(half_id=old_done.pk).exists()
    assert CommitLogEntry.objects.count() == Delivery.objects.count() == 2

    consuming.message_ack(group=consumers, receipt_handles=[r.receipt_handle for r in received])
    assert retention.retention_sweep() == swept(half_messages=0, commit_log=1)
    assert list(CommitLogEntry.objects.values_list("transaction_id", flat=True)) == [
        young_done.transaction_id
    ]
    assert Delivery.objects.count() == 1
    assert retention.retention_sweep() == swept()


def swept(**counts: int) -> dict[str, int]:
    return {"dead_letters": 0, "commit_log": 0, "half_messages": 0, "recalled": 0, **counts}
