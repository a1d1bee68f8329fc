"""The commit, as SQL: copying half messages into the commit log with their queue offsets,
marking them COMMITTED and appending their COMMIT ops, in one statement, so a commit-log row and
its op record cannot exist without each other (CONTRACT invariant 3); and one round trip on the
hottest path. Two statements: COMMIT_SQL for half messages the caller locked (one or many, of one
queue), and COMMIT_AT_ONCE_SQL, which takes the lock itself for the producer's plain commit.
Both append with the one commit-log append's clauses (sending.take_offsets, append_entries); both
are composed of constants only; every value is bound by the server."""

import json
import uuid
from collections.abc import Collection
from datetime import datetime
from typing import Any

from django.db import connection

from apps.broker import rows
from apps.broker.metrics import count_resolution
from apps.broker.models import (
    UNRESOLVED_STATES,
    CommitLogEntry,
    HalfMessage,
    OpKind,
    ProducerGroup,
    Topic,
    TransactionState,
)
from apps.broker.services.half_rows import half_of
from apps.broker.services.sending import append_entries, take_offsets


# The commit-log rows of half messages `h` (with their producer group `g`), as sending's
# append_entries reads them; `i`: each one's place among those appended.
def _halves(source: str, place: str) -> str:
    return f"""(
    SELECT h.msg_id, h.queue_id, h.tags, h.keys, h.properties, h.body, h.body_is_binary,
        h.born_at, g.name AS producer_group, h.transaction_id, h.topic_id, h.message_group,
        {place} AS i
    FROM {source} JOIN broker_producergroup g ON g.id = h.producer_group_id
) m"""  # noqa: S608 - composed of constants only


_RESOLVED = """UPDATE broker_halfmessage SET state = %(state)s, resolved_at = %(now)s,
        resolved_by = %(source)s, next_check_at = NULL"""
_OP = "INSERT INTO broker_oprecord (half_id, op, source, actor, reason, detail, at)"

# Half messages of one queue, each locked by the caller: appended together (sending's one
# append: their offsets taken in the order given, the queue row locked until the caller's
# transaction commits, one NOTIFY).
_BATCH = "batch JOIN broker_halfmessage h ON h.id = batch.id"
COMMIT_SQL = f"""
WITH queue AS ({take_offsets()}),
batch AS (SELECT id, i FROM unnest(%(half_ids)s::bigint[]) WITH ORDINALITY AS b(id, i)),
entry AS ({
    append_entries(
        messages=_halves(_BATCH, "batch.i"), returning='transaction_id, "offset", queue_offset'
    )
}),
resolved AS (
    {_RESOLVED}
    WHERE id IN (SELECT id FROM batch) AND EXISTS (SELECT 1 FROM entry)
),
op AS (
    {_OP}
    SELECT id, %(op)s, %(source)s, %(actor)s, %(reason)s, %(detail)s::jsonb, %(now)s FROM batch
    WHERE EXISTS (SELECT 1 FROM entry)
)
SELECT transaction_id, "offset", queue_offset FROM entry
"""  # noqa: S608


def _resolution(
    *, source: str, actor: str, reason: str, detail: dict[str, Any], now: datetime
) -> dict[str, Any]:
    """The values both commit statements bind for the resolution and its COMMIT op."""
    return {
        "now": now,
        "state": TransactionState.COMMITTED,
        "source": source,
        "op": OpKind.COMMIT,
        "actor": actor,
        "reason": reason,
        "detail": json.dumps(detail),
    }


def commit_locked(
    halves: list[HalfMessage],
    *,
    source: str,
    actor: str,
    reason: str,
    detail: dict[str, Any],
    now: datetime,
) -> list[CommitLogEntry]:
    """Commits half messages of one queue, each locked by the caller, unresolved and visible at
    once; their commit-log rows, in the order given. The halves are left as they were: the
    caller marks them (`mark_committed`, or as its own general path does)."""
    with connection.cursor() as cursor:
        cursor.execute(
            COMMIT_SQL,
            {
                "n": len(halves),
                "topic_id": halves[0].topic_id,
                "queue_id": halves[0].queue_id,
                "half_ids": [half.pk for half in halves],
                **_resolution(source=source, actor=actor, reason=reason, detail=detail, now=now),
            },
        )
        stored = {row[0]: (row[1], row[2]) for row in cursor.fetchall()}
    if len(stored) != len(halves):  # every half is locked by us and its queue row exists
        raise RuntimeError(f"commit stored {len(stored)} of {len(halves)} rows")
    return [log_entry(half, *stored[half.transaction_id], now) for half in halves]


# The plain commit (the producer's own, of an unresolved transaction of its group, visible at
# once) as ONE statement in its own transaction: the half's row lock, COMMIT_SQL's writes, and
# the rows the answer needs. The lock is taken in the `h` CTE with the conditions in its WHERE:
# if another resolution holds the row, Postgres re-checks them on the row it committed, so a
# transaction resolved meanwhile matches nothing, nothing is written, and the general path
# (lock, then decide: 200 again, 409, 404, a delayed commit) answers. Same lock order as the
# general path (the half, then its queue row). One round trip instead of four (BEGIN, lock,
# COMMIT_SQL, COMMIT).
COMMIT_AT_ONCE_SQL = f"""
WITH h AS (
    SELECT {rows.columns(HalfMessage, "h")} FROM broker_halfmessage h
    JOIN broker_producergroup pg ON pg.id = h.producer_group_id
    WHERE h.transaction_id = %(tid)s
        AND h.state = ANY(%(unresolved)s::varchar[])
        AND h.delay_seconds IS NULL
        AND (h.deliver_at IS NULL OR h.deliver_at <= %(now)s)
        AND (%(any_group)s OR pg.name = ANY(%(groups)s::varchar[]))
    FOR UPDATE OF h
),
queue AS ({
    take_offsets(
        where="q.topic_id = h.topic_id AND q.queue_id = h.queue_id", n="1", from_=" FROM h"
    )
}),
entry AS ({append_entries(messages=_halves("h", "1"), returning='"offset", queue_offset')}),
resolved AS (
    {_RESOLVED}
    WHERE id IN (SELECT id FROM h) AND EXISTS (SELECT 1 FROM entry)
),
op AS (
    {_OP}
    SELECT h.id, %(op)s, %(source)s, %(actor)s, %(reason)s, %(detail)s, %(now)s FROM h
    WHERE EXISTS (SELECT 1 FROM entry)
)
SELECT {rows.columns(HalfMessage, "h")}, {rows.columns(Topic, "t")},
    {rows.columns(ProducerGroup, "g")}, entry."offset", entry.queue_offset
FROM h JOIN broker_topic t ON t.id = h.topic_id
    JOIN broker_producergroup g ON g.id = h.producer_group_id, entry
"""  # noqa: S608


def commit_at_once(
    transaction_id: uuid.UUID,
    *,
    source: str,
    actor: str,
    reason: str,
    detail: dict[str, Any],
    producer_groups: Collection[str] | None,
    now: datetime,
) -> tuple[HalfMessage, CommitLogEntry] | None:
    """The plain commit in one statement (COMMIT_AT_ONCE_SQL), the half marked committed, or None
    when it is not the plain case (unknown, another group's, resolved already, delayed): nothing
    was written then."""
    with connection.cursor() as cursor:
        cursor.execute(
            COMMIT_AT_ONCE_SQL,
            {
                "tid": transaction_id,
                "unresolved": list(UNRESOLVED_STATES),
                "any_group": producer_groups is None,
                "groups": list(producer_groups or ()),
                **_resolution(source=source, actor=actor, reason=reason, detail=detail, now=now),
            },
        )
        row = cursor.fetchone()
    if row is None:
        return None
    half = half_of(row)
    mark_committed(half, source=source, now=now)
    return half, log_entry(half, row[-2], row[-1], now)


def log_entry(half: HalfMessage, offset: int, queue_offset: int, now: datetime) -> CommitLogEntry:
    """The commit-log row a commit statement stored for `half`, as the answer needs it."""
    return CommitLogEntry(
        offset=offset,
        queue_offset=queue_offset,
        msg_id=half.msg_id,
        topic=half.topic,
        queue_id=half.queue_id,
        transaction_id=half.transaction_id,
        producer_group=half.producer_group.name,
        stored_at=now,
    )


def mark_committed(half: HalfMessage, *, source: str, now: datetime) -> None:
    """`half` as a commit statement left its row, and the resolution counted."""
    half.state = TransactionState.COMMITTED
    half.resolved_at = now
    half.resolved_by = source
    half.next_check_at = None
    count_resolution(outcome=TransactionState.COMMITTED, resolved_by=source)
