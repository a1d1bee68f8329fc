"""Transactions made through the services in the test process (no HTTP): a producer group, a
prepared half, a check made due, a check-back result; and what a commit wrote."""

from datetime import timedelta
from typing import Any

from django.utils import timezone

from apps.broker.models import CommitLogEntry, HalfMessage, OpRecord, Resolver
from apps.broker.services import registry, transactions
from apps.broker.services.callbacks import CheckResult
from apps.broker.services.sending import OutgoingMessage
from apps.broker.services.transactions import Actor

PRODUCER = Actor(Resolver.PRODUCER, "test")


def make_group(url: str = "http://127.0.0.1:9/check", name: str = "shop") -> Any:
    return registry.producer_group_create(name=name, check_url=url)


def prepare(group: Any, topic: Any, **extra: Any) -> HalfMessage:
    message = OutgoingMessage(producer_group=group.name, body=b"order 9527", body_is_binary=False)
    return transactions.transaction_prepare(
        producer_group=group, topic=topic, message=message, actor=PRODUCER, **extra
    )


def make_due(*halves: HalfMessage) -> None:
    HalfMessage.objects.filter(pk__in=[h.pk for h in halves]).update(
        next_check_at=timezone.now() - timedelta(seconds=1)
    )


def result(answer: str, reached: bool = True) -> CheckResult:
    return CheckResult(answer, reached, 200 if reached else None, "", 5, "msg_test")


def commit_written(transaction_id: str) -> tuple[Any, ...]:
    """What a commit of the transaction wrote, comparable between two commits: the half's
    resolution, its commit-log row's copy of the message and its COMMIT op (ids and times
    compared within the transaction, not across)."""
    half = HalfMessage.objects.get(transaction_id=transaction_id)
    entry = CommitLogEntry.objects.get(transaction_id=transaction_id)
    [op] = OpRecord.objects.filter(half=half, op="COMMIT")
    assert entry.msg_id == half.msg_id
    assert entry.stored_at == half.resolved_at == op.at
    return (
        half.state,
        half.resolved_by,
        half.next_check_at,
        bytes(entry.body),
        entry.body_is_binary,
        entry.tags,
        entry.keys,
        entry.properties,
        entry.producer_group,
        entry.born_at == half.born_at,
        entry.queue_id == half.queue_id,
        op.source,
        op.actor,
        op.reason,
        op.detail,
    )
