"""What a commit wrote, compared between commits."""

from typing import Any


def commit_written(transaction_id: str) -> tuple[Any, ...]:
    """What a commit of the transaction wrote, comparable between two commits: the half's
    resolution, its commit-log row's copy of the message and its COMMIT op (ids and times
    compared within the transaction, not across)."""
    from apps.broker.models import CommitLogEntry, HalfMessage, OpRecord

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
