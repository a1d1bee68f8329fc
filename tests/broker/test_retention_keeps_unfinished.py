"""Retention deletes nothing a consumer group has not had (docs/decisions/0080): a message not yet
received, one in flight and one in a dead-letter queue survive a sweep past TXHUB_RETENTION; one
every group has had goes. Dead-letter entries have a retention of their own, counted from their
dead-lettering; one run drains more than one batch; recalled messages are swept; and a delayed
transaction's half outlives its log row's first days (the nightly reconciliation reads it)."""

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from apps.broker.access import Principal
from apps.broker.models import (
    CommitLogEntry,
    ConsumerGroup,
    DelayedMessage,
    Delivery,
    HalfMessage,
    OpRecord,
    RecalledMessage,
    Resolver,
    Topic,
)
from apps.broker.services import (
    consuming,
    dead_letters,
    delivery,
    recall,
    registry,
    retention,
    sending,
    transactions,
)
from apps.broker.services.sending import OutgoingMessage
from apps.broker.services.transactions import Actor

PRODUCER = Actor(Resolver.PRODUCER, "test")
ADMIN = Principal(token_id=0, name="test", scopes=frozenset({"admin"}))


def setup(*groups: str) -> tuple[Topic, list[ConsumerGroup]]:
    topic = registry.topic_create(name="orders", queues=1)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    made = [
        registry.consumer_group_create(name=name, max_delivery_attempts=16, consume_from="first")
        for name in groups
    ]
    return topic, made


def send(topic: Topic, n: int, *, in_hours: float | None = None) -> list[str]:
    due = None if in_hours is None else timezone.now() + timedelta(hours=in_hours)
    sent = sending.message_send_batch(
        topic=topic,
        messages=[
            (OutgoingMessage("shop", f"m{i}".encode(), body_is_binary=False), due) for i in range(n)
        ],
    )
    return [s.msg_id for s in sent]


def receive(group: ConsumerGroup, topic: Topic, n: int) -> dict[str, consuming.Received]:
    got = consuming.message_receive(group=group, topic=topic, max_messages=n, invisible_seconds=60)
    return {r.message.msg_id: r for r in got}


def ack(group: ConsumerGroup, *received: consuming.Received) -> None:
    handles = [r.receipt_handle for r in received]
    assert consuming.message_ack(group=group, receipt_handles=handles) == (handles, [])


def stored_hours_ago(hours: float) -> None:
    CommitLogEntry.objects.update(stored_at=timezone.now() - timedelta(hours=hours))


def in_log() -> set[str]:
    return set(CommitLogEntry.objects.values_list("msg_id", flat=True))


def dlq_of(group: ConsumerGroup) -> list[str]:
    rows = Delivery.objects.filter(group=group, state="DLQ").order_by("message_id")
    return list(rows.values_list("message__msg_id", flat=True))


def test_what_a_group_has_not_had_survives_and_what_every_group_acked_goes(db: None) -> None:
    topic, (billing, audit) = setup("billing", "audit")
    done, unread, inflight, dead = send(topic, 4)
    got = receive(billing, topic, 4)
    ack(billing, got[done], got[unread])
    dead_letters.message_dead_letter(group=billing, receipt_handle=got[dead].receipt_handle)
    ack(audit, receive(audit, topic, 1)[done])  # audit's cursor is past `done` only
    stored_hours_ago(73)

    swept = retention.retention_sweep()

    assert swept["commit_log"] == 1  # the positive control: `done`, which every group acked
    assert in_log() == {unread, inflight, dead}
    assert dlq_of(billing) == [dead]  # still there for an operator to see and resend
    ack(billing, got[inflight])  # its handle still acks
    assert list(receive(audit, topic, 10)) == [unread, inflight, dead]  # audit has them all


def test_a_group_that_stopped_holds_the_log_and_a_topic_nobody_reads_does_not(db: None) -> None:
    topic, (billing,) = setup("billing")
    first, later = send(topic, 2)
    ack(billing, receive(billing, topic, 1)[first])
    quiet = registry.topic_create(name="quiet", queues=2)
    unread = send(quiet, 3)
    stored_hours_ago(73)

    assert retention.retention_sweep()["commit_log"] == 1 + 3
    assert in_log() == {later}  # billing's cursor is before it; `quiet` has no cursor at all
    assert not set(unread) & in_log()


def test_a_message_held_behind_its_message_group_survives_the_retention(db: None) -> None:
    # FIFO (decision 0054): the cursor moves past a held message, so only its HELD delivery
    # says the group has not had it yet (decision 0080).
    topic = registry.topic_create(name="orders", queues=1)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    billing = registry.consumer_group_create(
        name="billing", max_delivery_attempts=16, consume_from="first", fifo=True
    )
    first, held = (
        s.msg_id
        for s in sending.message_send_batch(
            topic=topic,
            messages=[
                (OutgoingMessage("shop", body, body_is_binary=False, message_group="A"), None)
                for body in (b"a0", b"a1")
            ],
        )
    )
    got = receive(billing, topic, 2)
    assert list(got) == [first]
    ack(billing, got[first])
    stored_hours_ago(73)

    assert retention.retention_sweep()["commit_log"] == 1  # the acked one
    assert in_log() == {held}
    assert list(receive(billing, topic, 2)) == [held]


def test_a_dead_letter_entry_goes_after_its_own_retention_from_dead_lettering(
    db: None, settings: Any
) -> None:
    settings.TXHUB_DLQ_RETENTION = 72 * 3600
    topic, (billing,) = setup("billing")
    [dead] = send(topic, 1)
    got = receive(billing, topic, 1)
    dead_letters.message_dead_letter(group=billing, receipt_handle=got[dead].receipt_handle)
    stored_hours_ago(100)
    Delivery.objects.update(dlq_at=timezone.now() - timedelta(hours=1))

    swept = retention.retention_sweep()
    assert (swept["dead_letters"], swept["commit_log"]) == (0, 0)
    assert dlq_of(billing) == [dead]

    Delivery.objects.update(dlq_at=timezone.now() - timedelta(hours=73))
    swept = retention.retention_sweep()
    assert (swept["dead_letters"], swept["commit_log"]) == (1, 1)
    assert not Delivery.objects.exists()
    assert not in_log()


def test_a_dead_letter_entry_past_its_retention_goes_although_its_message_stays(
    db: None, settings: Any
) -> None:
    settings.TXHUB_DLQ_RETENTION = 3600
    topic, (billing,) = setup("billing")
    [dead] = send(topic, 1)
    got = receive(billing, topic, 1)
    dead_letters.message_dead_letter(group=billing, receipt_handle=got[dead].receipt_handle)
    stored_hours_ago(2)
    Delivery.objects.update(dlq_at=timezone.now() - timedelta(hours=2))

    swept = retention.retention_sweep()
    assert (swept["dead_letters"], swept["commit_log"]) == (1, 0)  # the log row is young
    assert dlq_of(billing) == []
    assert in_log() == {dead}


def test_one_run_drains_more_than_one_batch(db: None) -> None:
    topic, (billing, audit) = setup("billing", "audit")
    shop = registry.producer_group_create(name="shop2", check_url="http://127.0.0.1:9/")
    send(topic, 4)
    halves = [
        transactions.transaction_prepare(
            producer_group=shop,
            topic=topic,
            message=OutgoingMessage("shop2", b"t", body_is_binary=False),
            actor=PRODUCER,
        )
        for _ in range(5)
    ]
    for half in halves[:3]:
        transactions.transaction_commit(transaction_id=half.transaction_id, actor=PRODUCER)
    for half in halves[3:]:
        transactions.transaction_rollback(transaction_id=half.transaction_id, actor=PRODUCER)
    ack(billing, *receive(billing, topic, 10).values())
    for got in receive(audit, topic, 10).values():
        dead_letters.message_dead_letter(group=audit, receipt_handle=got.receipt_handle)
    stored_hours_ago(73)
    long_ago = timezone.now() - timedelta(hours=73)
    HalfMessage.objects.update(resolved_at=long_ago)
    Delivery.objects.filter(state="DLQ").update(dlq_at=long_ago)

    swept = retention.retention_sweep(batch=2)

    assert swept == {"dead_letters": 7, "commit_log": 7, "half_messages": 5, "recalled": 0}
    assert not CommitLogEntry.objects.exists()
    assert not Delivery.objects.exists()
    assert not HalfMessage.objects.exists()
    assert not OpRecord.objects.exists()


def test_a_run_out_of_time_stops_after_its_batch_and_the_next_run_goes_on(db: None) -> None:
    topic, (billing,) = setup("billing")
    send(topic, 5)
    ack(billing, *receive(billing, topic, 10).values())
    stored_hours_ago(73)

    assert retention.retention_sweep(batch=2, seconds=0)["commit_log"] == 2
    assert retention.retention_sweep(batch=2)["commit_log"] == 3


def test_recalled_messages_go_after_the_retention_from_their_recall(db: None) -> None:
    topic, _ = setup()
    old_ones, young = send(topic, 2, in_hours=1), send(topic, 1, in_hours=1)
    for msg_id in old_ones + young:
        recall.message_recall(msg_id=msg_id, principal=ADMIN, door="rest")
    long_ago = timezone.now() - timedelta(hours=73)
    RecalledMessage.objects.filter(msg_id__in=old_ones).update(recalled_at=long_ago)

    assert retention.retention_sweep(batch=1)["recalled"] == 2
    assert list(RecalledMessage.objects.values_list("msg_id", flat=True)) == young


def test_a_delayed_transactions_half_stays_until_its_log_row_is_past_the_retention(
    db: None,
) -> None:
    topic, _ = setup()
    shop = registry.producer_group_create(name="shop2", check_url="http://127.0.0.1:9/")
    half = transactions.transaction_prepare(
        producer_group=shop,
        topic=topic,
        message=OutgoingMessage("shop2", b"t", body_is_binary=False),
        actor=PRODUCER,
        deliver_at=timezone.now() + timedelta(days=2),
    )
    transactions.transaction_commit(transaction_id=half.transaction_id, actor=PRODUCER)
    # Committed 73 h ago, its delivery time (up to TXHUB_MAX_DELAY away) still to come.
    HalfMessage.objects.update(resolved_at=timezone.now() - timedelta(hours=73))

    assert retention.retention_sweep()["half_messages"] == 0  # its message still waits
    DelayedMessage.objects.update(deliver_at=timezone.now() - timedelta(seconds=1))
    assert delivery.delayed_deliver_due() == 1
    # In the log now, stored today: tonight's reconciliation of today reads its half.
    assert retention.retention_sweep()["half_messages"] == 0
    assert OpRecord.objects.filter(half_id=half.pk, op="COMMIT").exists()

    stored_hours_ago(73)
    swept = retention.retention_sweep()
    assert (swept["half_messages"], swept["commit_log"]) == (1, 1)
    assert not HalfMessage.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_sweep_leaves_a_topic_alone_while_a_group_makes_its_first_cursors() -> None:
    """A group's first receive makes its cursors from offset 0 and reads from them in one
    transaction: the sweep must not delete a row that receive is about to hand out."""
    topic, (billing,) = setup("billing")
    [old] = send(topic, 1)
    stored_hours_ago(73)
    made, release = threading.Event(), threading.Event()

    def first_receive() -> None:
        try:
            with transaction.atomic():
                consuming._ensure_cursors(billing, topic)
                made.set()
                release.wait(10)
        finally:
            connection.close()

    receiver = threading.Thread(target=first_receive)
    receiver.start()
    try:
        assert made.wait(10)
        assert retention.retention_sweep()["commit_log"] == 0
    finally:
        release.set()
        receiver.join(10)
    # Committed now: billing's cursor is before the row, which it has not had.
    assert retention.retention_sweep()["commit_log"] == 0
    assert list(receive(billing, topic, 1)) == [old]
