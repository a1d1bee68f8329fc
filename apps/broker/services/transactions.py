"""The life of a transactional (half) message: prepare, commit, rollback, park, resume.

Every path that changes a transaction's state, whoever calls it (REST, console, admin, check-back,
Celery), goes through `_transition`, which locks the half message's row first.
"""

import contextlib
import json
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.broker import failpoints, limits, rows
from apps.broker.metrics import count_resolution
from apps.broker.models import (
    UNRESOLVED_STATES,
    CommitLogEntry,
    DelayedMessage,
    HalfMessage,
    OpKind,
    OpRecord,
    ProducerGroup,
    Resolver,
    Topic,
    TransactionState,
    new_msg_id,
)
from apps.broker.services.client_ids import stored_id_for
from apps.broker.services.errors import BrokerError, Conflict, NotFound, TransactionResolved
from apps.broker.services.sending import (
    NEXT_QUEUE_OFFSET_SQL,
    RECEIVABLE_CHANNEL,
    TAKE_OFFSETS_SQL,
    OutgoingMessage,
    delayed_store,
    queue_for,
)

FINAL_STATES = (TransactionState.COMMITTED, TransactionState.ROLLED_BACK)


@dataclass(frozen=True)
class Actor:
    """Who acts: the source kept in op records, and a name (token or user name)."""

    source: Resolver
    name: str = ""


@dataclass(frozen=True)
class Resolution:
    half: HalfMessage
    entry: CommitLogEntry | None  # the commit-log row of a committed transaction
    deliver_at: datetime | None = None  # a delayed commit: when it becomes visible
    changed: bool = True  # False when the same resolution was already there (nothing written)


@dataclass(frozen=True)
class Prepared:
    """One half message to store: the message and how its delivery and first check are timed."""

    message: OutgoingMessage
    check_immunity_seconds: int | None = None
    delay_level: int | None = None
    deliver_at: datetime | None = None
    msg_id: str | None = None  # the producer's own message id (a RocketMQ client's)


def transaction_prepare(
    *,
    producer_group: ProducerGroup,
    topic: Topic,
    message: OutgoingMessage,
    actor: Actor,
    check_immunity_seconds: int | None = None,
    delay_level: int | None = None,
    deliver_at: datetime | None = None,
    msg_id: str | None = None,
) -> HalfMessage:
    """Stores the half message (invisible). A delay applies from the commit on: a level is kept
    as seconds to count from the commit, an instant as it is.

    `msg_id`: the producer's own message id (a RocketMQ client's), scoped to its producer group
    (services/client_ids.py). A retry with the same id answers the half message the first one
    stored and stores nothing."""
    if msg_id is None:
        item = Prepared(message, check_immunity_seconds, delay_level, deliver_at, None)
        [half] = transaction_prepare_batch(
            producer_group=producer_group, topic=topic, items=[item], actor=actor
        )
        return half
    for _ in range(3):
        stored_id = stored_id_for(client_id=msg_id, producer_group=producer_group.name)
        earlier = _half_by_client_id(stored_id, producer_group, topic)
        if earlier is not None:
            return earlier
        item = Prepared(message, check_immunity_seconds, delay_level, deliver_at, stored_id)
        try:
            [half] = transaction_prepare_batch(
                producer_group=producer_group, topic=topic, items=[item], actor=actor
            )
            return half
        except IntegrityError:
            # A concurrent retry stored it first (unique msg_id): answer what it stored; or
            # another group took the id meanwhile: this group's message takes its scoped id.
            continue
    raise Conflict(f"Message id {msg_id} is in use.")


def _half_by_client_id(
    msg_id: str, producer_group: ProducerGroup, topic: Topic
) -> HalfMessage | None:
    """The group's half message stored under `msg_id`, or None. Another group's message under
    it (a race with `stored_id_for`) is a conflict that says nothing about it."""
    half = HalfMessage.objects.filter(msg_id=msg_id).select_related("topic", "producer_group")
    earlier = half.first()
    if earlier is None:
        for model in (CommitLogEntry, DelayedMessage):
            holder = model.objects.filter(msg_id=msg_id).values_list("producer_group", flat=True)
            name = holder.first()
            if name == producer_group.name:
                raise Conflict(f"Message id {msg_id} is in use by another message.")
            if name is not None:
                raise Conflict(f"Message id {msg_id} is in use.")
        return None
    if earlier.producer_group_id != producer_group.pk:
        raise Conflict(f"Message id {msg_id} is in use.")
    if earlier.topic_id != topic.pk:
        raise Conflict(f"Message id {msg_id} is in use by another message.")
    return earlier


def transaction_prepare_batch(
    *, producer_group: ProducerGroup, topic: Topic, items: list[Prepared], actor: Actor
) -> list[HalfMessage]:
    """Half messages of one group and topic, all stored in one transaction or none (one INSERT
    for the halves, one for their PREPARE ops), in the order given."""
    now = timezone.now()
    halves = []
    for item in items:
        msg_id = item.msg_id or new_msg_id()
        # The first check no sooner than TXHUB_TRANSACTION_TIMEOUT; immunity raises it, never
        # lowers it.
        first_check = max(settings.TXHUB_TRANSACTION_TIMEOUT, item.check_immunity_seconds or 0)
        halves.append(
            HalfMessage(
                msg_id=msg_id,
                producer_group=producer_group,
                topic=topic,
                queue_id=queue_for(topic=topic, msg_id=msg_id),
                **item.message.row_fields(),
                born_at=now,
                check_immunity_seconds=item.check_immunity_seconds,
                next_check_at=now + timedelta(seconds=first_check),
                delay_seconds=(
                    limits.DELAY_LEVEL_SECONDS[item.delay_level - 1] if item.delay_level else None
                ),
                deliver_at=item.deliver_at,
            )
        )
    _insert_prepared(halves, actor, now)
    if failpoints.ARMED:
        failpoints.hit_after_commit("after_half_insert")
    return halves


# Every half message of a prepare (one or a batch of 64) and its PREPARE op, in one statement:
# one round trip, atomic without a transaction block of its own, and none of the ORM's per-row
# work (bulk_create cost ~8 ms of CPU for 64 rows; this, ~1 ms). Composed of constants only.
# One row of PREPARE_SQL's VALUES per half message: scalar parameters, each typed here. (Arrays
# through unnest() cost psycopg a type search per list and per request: ~7 % of a prepare's web
# CPU, profiled.)
_PREPARED_ROW = (
    "(%s::varchar, %s::int, %s::varchar, %s::jsonb, %s::jsonb, %s::bytea, %s::bool, %s::uuid, "
    "%s::int, %s::timestamptz, %s::int, %s::timestamptz)"
)

PREPARE_SQL = """
WITH m(msg_id, queue_id, tags, keys, properties, body, body_is_binary, transaction_id, immunity,
    next_check_at, delay_seconds, deliver_at) AS (VALUES {rows}),
half AS (
    INSERT INTO broker_halfmessage (msg_id, queue_id, tags, keys, properties, body,
        body_is_binary, born_at, transaction_id, producer_group_id, topic_id, state, check_times,
        check_immunity_seconds, next_check_at, checking_until, unreachable_checks, delay_seconds,
        deliver_at, resolved_at, resolved_by)
    SELECT m.msg_id, m.queue_id, m.tags, m.keys, m.properties, m.body, m.body_is_binary,
        %s::timestamptz, m.transaction_id, %s::bigint, %s::bigint, %s::varchar, 0, m.immunity,
        m.next_check_at, NULL, 0, m.delay_seconds, m.deliver_at, NULL, ''
    FROM m
    RETURNING id, msg_id
),
op AS (
    INSERT INTO broker_oprecord (half_id, op, source, actor, reason, detail, at)
    SELECT id, %s, %s, %s, '', '{{}}'::jsonb, %s::timestamptz FROM half
)
SELECT id, msg_id FROM half
"""


def _insert_prepared(halves: list[HalfMessage], actor: Actor, now: datetime) -> None:
    first = halves[0]
    params: list[Any] = []
    for h in halves:
        params += (
            h.msg_id,
            h.queue_id,
            h.tags,
            json.dumps(h.keys),
            json.dumps(h.properties),
            bytes(h.body),
            h.body_is_binary,
            h.transaction_id,
            h.check_immunity_seconds,
            h.next_check_at,
            h.delay_seconds,
            h.deliver_at,
        )
    params += (now, first.producer_group_id, first.topic_id, TransactionState.PREPARED)
    params += (OpKind.PREPARE, actor.source, actor.name, now)
    # Inside a caller's transaction, a savepoint: a duplicate msg_id (IntegrityError, answered
    # by transaction_prepare's retry) must not abort the caller's transaction.
    nested = transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext()
    with nested, connection.cursor() as cursor:
        cursor.execute(PREPARE_SQL.format(rows=", ".join([_PREPARED_ROW] * len(halves))), params)
        ids = dict((msg_id, pk) for pk, msg_id in cursor.fetchall())
    for half in halves:
        half.pk = ids[half.msg_id]
        half._state.adding = False


def transaction_commit(
    *,
    transaction_id: uuid.UUID,
    actor: Actor,
    reason: str = "",
    detail: dict[str, Any] | None = None,
    producer_groups: Collection[str] | None = None,
) -> Resolution:
    resolution = None
    if not connection.in_atomic_block:
        resolution = _commit_at_once(transaction_id, actor, reason, detail or {}, producer_groups)
    if resolution is None:  # not the plain case (or inside a caller's transaction)
        resolution = _resolve(
            transaction_id, TransactionState.COMMITTED, actor, reason, detail, producer_groups
        )
    if failpoints.ARMED:
        failpoints.hit_after_commit("after_commit_before_answer")
    return resolution


def transaction_rollback(
    *,
    transaction_id: uuid.UUID,
    actor: Actor,
    reason: str = "",
    detail: dict[str, Any] | None = None,
    producer_groups: Collection[str] | None = None,
) -> Resolution:
    return _resolve(
        transaction_id, TransactionState.ROLLED_BACK, actor, reason, detail, producer_groups
    )


@dataclass(frozen=True)
class Outcome:
    """What became of one transaction of a batch: its resolution, or the error it would have
    answered on its own (the other transactions of the batch are not affected by it)."""

    transaction_id: uuid.UUID
    resolution: Resolution | None
    error: BrokerError | None


def transaction_resolve_batch(
    *,
    transaction_ids: list[uuid.UUID],
    commit: bool,
    actor: Actor,
    reason: str = "",
    producer_groups: Collection[str] | None = None,
) -> list[Outcome]:
    """Commits (or rolls back) each transaction as its own commit or rollback would, in one
    database transaction; one outcome per id, in the order given. The ids must be distinct."""
    target = TransactionState.COMMITTED if commit else TransactionState.ROLLED_BACK
    outcomes: dict[uuid.UUID, Outcome] = {}
    with transaction.atomic():
        # Lock: every row of the batch, in id order, before any is changed. Two batches over the
        # same transactions in opposite orders then queue up instead of deadlocking; a single
        # commit (one row, then its queue) never waits for a row the batch could be waiting on.
        halves = {half.transaction_id: half for half in _lock_all(transaction_ids)}

        # Then the commits take their queue rows in (topic, queue) order, like every appending
        # transaction (sending.message_send_batch, the delayed delivery scan).
        def place(tid: uuid.UUID) -> tuple[int, int]:
            half = halves.get(tid)
            return (half.topic_id, half.queue_id) if half else (0, 0)

        now = timezone.now()
        plain: dict[tuple[int, int], list[HalfMessage]] = {}  # visible commits, by queue
        for tid in sorted(transaction_ids, key=place):
            try:
                half = _owned(halves.get(tid), tid, producer_groups)
                if commit and half.state in UNRESOLVED_STATES and not _delivery_due(half, now):
                    plain.setdefault((half.topic_id, half.queue_id), []).append(half)
                    continue
                resolution = _apply(half, target, actor, reason, None, now)
                outcomes[tid] = Outcome(tid, resolution, None)
            except BrokerError as error:  # raised before _apply wrote anything
                outcomes[tid] = Outcome(tid, None, error)
        # The commits that become visible at once: one statement per queue, in (topic, queue)
        # order, as a single commit's statement would do for each of them.
        for place_key in sorted(plain):
            for half, entry in _commit_many(plain[place_key], actor, reason, now):
                outcomes[half.transaction_id] = Outcome(
                    half.transaction_id, Resolution(half, entry), None
                )
    if commit and failpoints.ARMED:
        failpoints.hit_after_commit("after_commit_before_answer")
    return [outcomes[tid] for tid in transaction_ids]


@transaction.atomic
def transaction_park(*, transaction_id: uuid.UUID, actor: Actor, reason: str) -> HalfMessage:
    """PREPARED -> PARKED: check-back gave up. Anything else is left as it is."""
    half = _lock(transaction_id, None)
    if half.state == TransactionState.PREPARED:
        half.state = TransactionState.PARKED
        half.next_check_at = None
        half.save(update_fields=["state", "next_check_at"])
        _record(half, OpKind.PARK, actor, reason=reason)
    return half


@transaction.atomic
def transaction_resume(*, transaction_id: uuid.UUID, actor: Actor, reason: str = "") -> HalfMessage:
    """PARKED -> PREPARED with the check count reset, so check-back asks again."""
    half = _lock(transaction_id, None)
    if half.state in FINAL_STATES:
        raise TransactionResolved(state=half.state)
    if half.state != TransactionState.PARKED:
        raise Conflict("Only a PARKED transaction can be resumed.", state=half.state)
    half.state = TransactionState.PREPARED
    half.check_times = 0
    half.next_check_at = timezone.now()
    half.save(update_fields=["state", "check_times", "next_check_at"])
    _record(half, OpKind.RESUME, actor, reason=reason)
    return half


@transaction.atomic
def _resolve(
    transaction_id: uuid.UUID,
    target: TransactionState,
    actor: Actor,
    reason: str,
    detail: dict[str, Any] | None,
    producer_groups: Collection[str] | None,
) -> Resolution:
    return _apply(_lock(transaction_id, producer_groups), target, actor, reason, detail)


def _apply(
    half: HalfMessage,
    target: TransactionState,
    actor: Actor,
    reason: str,
    detail: dict[str, Any] | None,
    now: datetime | None = None,
) -> Resolution:
    """`target` applied to a half message whose row the caller locked. A BrokerError is raised
    before anything is written."""
    if half.state == target:
        # Same resolution again: same answer, nothing written (idempotent retries).
        entry = _entry_of(half)
        due = None if entry else _delayed_due_of(half)
        return Resolution(half, entry, due, changed=False)
    if half.state not in UNRESOLVED_STATES:
        raise TransactionResolved(state=half.state)
    # A batch passes the instant it decided "visible at once or delayed" with: a half due in
    # between must not be committed here, out of the batch's queue lock order.
    now = now or timezone.now()
    half.state = target
    half.resolved_at = now
    half.resolved_by = actor.source
    half.next_check_at = None
    count_resolution(outcome=target, resolved_by=actor.source)
    if target == TransactionState.COMMITTED:
        due = _delivery_due(half, now)
        if due is None:
            return Resolution(half, _commit_statement(half, actor, reason, detail or {}, now))
        # Delayed from the commit on: the commit-log row appears when due (delivery scan).
        delayed_store(
            topic_id=half.topic_id,
            queue_id=half.queue_id,
            msg_id=half.msg_id,
            message=_outgoing(half),
            deliver_at=due,
            born_at=half.born_at,
            transaction_id=half.transaction_id,
        )
        half.save(update_fields=["state", "resolved_at", "resolved_by", "next_check_at"])
        _record(
            half,
            OpKind.COMMIT,
            actor,
            reason=reason,
            detail={**(detail or {}), "deliver_at": due.isoformat()},
            at=now,
        )
        return Resolution(half, None, due)
    half.save(update_fields=["state", "resolved_at", "resolved_by", "next_check_at"])
    _record(half, OpKind.ROLLBACK, actor, reason=reason, detail=detail, at=now)
    return Resolution(half, None)


# The commit, as one statement: takes the queue's next offset (the queue row stays locked until
# our transaction commits: see next_queue_offset), copies the half message into the commit log,
# marks the half COMMITTED and appends the COMMIT op. One statement, so the commit-log row and the
# op record cannot exist without each other (invariant 3); and one round trip on the hottest path.
# Composed of constants only; every value is bound by the server.
COMMIT_SQL = f"""
WITH queue AS ({NEXT_QUEUE_OFFSET_SQL}),
entry AS (
    INSERT INTO broker_commitlogentry (msg_id, queue_id, tags, keys, properties, body,
        body_is_binary, born_at, queue_offset, producer_group, transaction_id, stored_at, topic_id)
    SELECT h.msg_id, h.queue_id, h.tags, h.keys, h.properties, h.body, h.body_is_binary,
        h.born_at, queue.queue_offset, %(group)s, h.transaction_id, %(now)s, h.topic_id
    FROM broker_halfmessage h, queue WHERE h.id = %(half_id)s
    RETURNING "offset", queue_offset
),
resolved AS (
    UPDATE broker_halfmessage SET state = %(state)s, resolved_at = %(now)s,
        resolved_by = %(source)s, next_check_at = NULL
    WHERE id = %(half_id)s
),
op AS (
    INSERT INTO broker_oprecord (half_id, op, source, actor, reason, detail, at)
    VALUES (%(half_id)s, %(op)s, %(source)s, %(actor)s, %(reason)s, %(detail)s, %(now)s)
)
SELECT "offset", queue_offset FROM entry
"""  # noqa: S608


def _commit_statement(
    half: HalfMessage, actor: Actor, reason: str, detail: dict[str, Any], now: datetime
) -> CommitLogEntry:
    with connection.cursor() as cursor:
        cursor.execute(
            COMMIT_SQL,
            {
                "topic_id": half.topic_id,
                "queue_id": half.queue_id,
                "group": half.producer_group.name,
                "now": now,
                "half_id": half.pk,
                "state": TransactionState.COMMITTED,
                "source": actor.source,
                "op": OpKind.COMMIT,
                "actor": actor.name,
                "reason": reason,
                "detail": json.dumps(detail),
            },
        )
        row = cursor.fetchone()
    assert row is not None, "the half row is locked by us, so the insert happened"  # noqa: S101
    return _log_entry(half, row[0], row[1], now)


def _log_entry(half: HalfMessage, offset: int, queue_offset: int, now: datetime) -> CommitLogEntry:
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


def _committed_in_sql(half: HalfMessage, actor: Actor, now: datetime) -> None:
    """`half` as a one-statement commit left its row (COMMIT_MANY_SQL, COMMIT_AT_ONCE_SQL), and
    the resolution counted, as `_apply` does for the general path."""
    half.state = TransactionState.COMMITTED
    half.resolved_at = now
    half.resolved_by = actor.source
    half.next_check_at = None
    count_resolution(outcome=TransactionState.COMMITTED, resolved_by=actor.source)


# COMMIT_SQL for many half messages of one queue: their offsets taken together (in the order
# given) and announced by one NOTIFY, their rows copied into the commit log, the halves marked
# COMMITTED and their COMMIT ops appended, in one statement (one round trip instead of one per
# transaction; invariant 3 holds per row as in COMMIT_SQL). Composed of constants only.
COMMIT_MANY_SQL = f"""
WITH queue AS ({TAKE_OFFSETS_SQL}),
batch AS (SELECT id, i FROM unnest(%(half_ids)s::bigint[]) WITH ORDINALITY AS b(id, i)),
entry AS (
    INSERT INTO broker_commitlogentry (msg_id, queue_id, tags, keys, properties, body,
        body_is_binary, born_at, queue_offset, producer_group, transaction_id, stored_at, topic_id)
    SELECT h.msg_id, h.queue_id, h.tags, h.keys, h.properties, h.body, h.body_is_binary,
        h.born_at, queue.first_offset + batch.i - 1, g.name, h.transaction_id, %(now)s, h.topic_id
    FROM batch JOIN broker_halfmessage h ON h.id = batch.id
        JOIN broker_producergroup g ON g.id = h.producer_group_id, queue
    ORDER BY batch.i
    RETURNING transaction_id, "offset", queue_offset
),
resolved AS (
    UPDATE broker_halfmessage SET state = %(state)s, resolved_at = %(now)s,
        resolved_by = %(source)s, next_check_at = NULL
    WHERE id IN (SELECT id FROM batch) AND EXISTS (SELECT 1 FROM entry)
),
op AS (
    INSERT INTO broker_oprecord (half_id, op, source, actor, reason, detail, at)
    SELECT id, %(op)s, %(source)s, %(actor)s, %(reason)s, '{{}}'::jsonb, %(now)s FROM batch
    WHERE EXISTS (SELECT 1 FROM entry)
)
SELECT transaction_id, "offset", queue_offset FROM entry
"""  # noqa: S608


def _commit_many(
    halves: list[HalfMessage], actor: Actor, reason: str, now: datetime
) -> list[tuple[HalfMessage, CommitLogEntry]]:
    """Commits half messages of one queue, each locked by the caller and unresolved, each
    visible at once; their commit-log rows in the order given."""
    with connection.cursor() as cursor:
        cursor.execute(
            COMMIT_MANY_SQL,
            {
                "n": len(halves),
                "topic_id": halves[0].topic_id,
                "queue_id": halves[0].queue_id,
                "half_ids": [half.pk for half in halves],
                "now": now,
                "state": TransactionState.COMMITTED,
                "source": actor.source,
                "op": OpKind.COMMIT,
                "actor": actor.name,
                "reason": reason,
            },
        )
        stored = {row[0]: (row[1], row[2]) for row in cursor.fetchall()}
    if len(stored) != len(halves):  # every half is locked by us and its queue row exists
        raise RuntimeError(f"batch commit stored {len(stored)} of {len(halves)} rows")
    committed = []
    for half in halves:
        _committed_in_sql(half, actor, now)
        committed.append((half, _log_entry(half, *stored[half.transaction_id], now)))
    return committed


# The plain commit (the producer's own, of an unresolved transaction of its group, visible at
# once) as ONE statement in its own transaction: the half's row lock, COMMIT_SQL's writes, and
# the rows the answer needs. The lock is taken in the `h` CTE with the conditions in its WHERE:
# if another resolution holds the row, Postgres re-checks them on the row it committed, so a
# transaction resolved meanwhile matches nothing, nothing is written, and the general path
# (lock, then decide: 200 again, 409, 404, a delayed commit) answers. Same lock order as the
# general path (the half, then its queue row). One round trip instead of four (BEGIN, lock,
# COMMIT_SQL, COMMIT). Composed of constants only.
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
queue AS (
    UPDATE broker_messagequeue q SET next_offset = q.next_offset + 1
    FROM h WHERE q.topic_id = h.topic_id AND q.queue_id = h.queue_id
    RETURNING q.next_offset - 1 AS queue_offset,
        pg_notify('{RECEIVABLE_CHANNEL}', concat_ws(' ', q.topic_id, q.queue_id, q.next_offset - 1))
),
entry AS (
    INSERT INTO broker_commitlogentry (msg_id, queue_id, tags, keys, properties, body,
        body_is_binary, born_at, queue_offset, producer_group, transaction_id, stored_at, topic_id)
    SELECT h.msg_id, h.queue_id, h.tags, h.keys, h.properties, h.body, h.body_is_binary,
        h.born_at, queue.queue_offset, g.name, h.transaction_id, %(now)s, h.topic_id
    FROM h JOIN broker_producergroup g ON g.id = h.producer_group_id, queue
    RETURNING "offset", queue_offset
),
resolved AS (
    UPDATE broker_halfmessage SET state = %(state)s, resolved_at = %(now)s,
        resolved_by = %(source)s, next_check_at = NULL
    WHERE id IN (SELECT id FROM h) AND EXISTS (SELECT 1 FROM entry)
),
op AS (
    INSERT INTO broker_oprecord (half_id, op, source, actor, reason, detail, at)
    SELECT h.id, %(op)s, %(source)s, %(actor)s, %(reason)s, %(detail)s, %(now)s FROM h
    WHERE EXISTS (SELECT 1 FROM entry)
)
SELECT {rows.columns(HalfMessage, "h")}, {rows.columns(Topic, "t")},
    {rows.columns(ProducerGroup, "g")}, entry."offset", entry.queue_offset
FROM h JOIN broker_topic t ON t.id = h.topic_id
    JOIN broker_producergroup g ON g.id = h.producer_group_id, entry
"""  # noqa: S608


def _commit_at_once(
    transaction_id: uuid.UUID,
    actor: Actor,
    reason: str,
    detail: dict[str, Any],
    producer_groups: Collection[str] | None,
) -> Resolution | None:
    """The plain commit in one statement (COMMIT_AT_ONCE_SQL), or None when it is not the plain
    case (unknown, another group's, resolved already, delayed): nothing was written then."""
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            COMMIT_AT_ONCE_SQL,
            {
                "tid": transaction_id,
                "unresolved": list(UNRESOLVED_STATES),
                "now": now,
                "any_group": producer_groups is None,
                "groups": list(producer_groups or ()),
                "state": TransactionState.COMMITTED,
                "source": actor.source,
                "op": OpKind.COMMIT,
                "actor": actor.name,
                "reason": reason,
                "detail": json.dumps(detail),
            },
        )
        row = cursor.fetchone()
    if row is None:
        return None
    half = _half_of(row)
    _committed_in_sql(half, actor, now)
    return Resolution(half, _log_entry(half, row[-2], row[-1], now))


def _delivery_due(half: HalfMessage, now: datetime) -> datetime | None:
    if half.delay_seconds:
        return now + timedelta(seconds=half.delay_seconds)
    if half.deliver_at and half.deliver_at > now:
        return half.deliver_at
    return None


def _outgoing(half: HalfMessage) -> OutgoingMessage:
    return OutgoingMessage.of(half, half.producer_group.name)


_LOCK_SQL = (
    f"SELECT {rows.columns(HalfMessage, 'h')}, {rows.columns(Topic, 't')}, "  # noqa: S608
    f"{rows.columns(ProducerGroup, 'g')} FROM broker_halfmessage h "
    "JOIN broker_topic t ON t.id = h.topic_id "
    "JOIN broker_producergroup g ON g.id = h.producer_group_id "
    "WHERE {where} FOR UPDATE OF h"
)


def _lock(transaction_id: uuid.UUID, producer_groups: Collection[str] | None) -> HalfMessage:
    # Lock: commit, rollback, a check-back answer and an operator action on one transaction
    # queue up here, so exactly one of them moves it to a final state (CONTRACT invariant 2).
    # FOR UPDATE OF h: lock only the half row, not its (shared) topic and group rows. Plain SQL
    # (the commit's hot path): the ORM's compilation of this query cost more CPU than the rest
    # of the commit together.
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_SQL.format(where="h.transaction_id = %s"), [transaction_id])
        row = cursor.fetchone()
    return _owned(None if row is None else _half_of(row), transaction_id, producer_groups)


def _lock_all(transaction_ids: list[uuid.UUID]) -> list[HalfMessage]:
    """_lock for a batch: the rows locked in id order (the order every batch takes them in)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _LOCK_SQL.format(where="h.transaction_id = ANY(%s::uuid[]) ORDER BY h.id"),
            [transaction_ids],
        )
        found = cursor.fetchall()
    # A batch's halves mostly share one topic and group: each is loaded once, not once per row
    # (building model instances was a sixth of a batch commit's web CPU, profiled).
    shared: dict[tuple[type, Any], Any] = {}
    return [_half_of(row, shared) for row in found]


def _half_of(row: Any, shared: dict[tuple[type, Any], Any] | None = None) -> HalfMessage:
    half = rows.load(HalfMessage, row)
    at = rows.width(HalfMessage)
    for model, field in ((Topic, "topic"), (ProducerGroup, "producer_group")):
        key = (model, row[at])  # the row's slice of `model` starts with its id
        related = None if shared is None else shared.get(key)
        if related is None:
            related = rows.load(model, row, at)
            if shared is not None:
                shared[key] = related
        setattr(half, field, related)
        at += rows.width(model)
    return half


def _owned(
    half: HalfMessage | None, transaction_id: uuid.UUID, producer_groups: Collection[str] | None
) -> HalfMessage:
    if half is None or (
        producer_groups is not None and half.producer_group.name not in producer_groups
    ):
        # Another group's transaction answers as if it did not exist.
        raise NotFound(f"Transaction {transaction_id} does not exist.")
    return half


def _delayed_due_of(half: HalfMessage) -> datetime | None:
    delayed = DelayedMessage.objects.filter(transaction_id=half.transaction_id).first()
    return delayed.deliver_at if delayed else None


def _entry_of(half: HalfMessage) -> CommitLogEntry | None:
    if half.state != TransactionState.COMMITTED:
        return None
    return CommitLogEntry.objects.filter(transaction_id=half.transaction_id).first()


def _record(
    half: HalfMessage,
    op: OpKind,
    actor: Actor,
    *,
    reason: str = "",
    detail: dict[str, Any] | None = None,
    at: Any = None,
) -> OpRecord:
    record = _op(half, op, actor, reason=reason, detail=detail, at=at)
    record.save(force_insert=True)
    return record


def _op(
    half: HalfMessage,
    op: OpKind,
    actor: Actor,
    *,
    reason: str = "",
    detail: dict[str, Any] | None = None,
    at: Any = None,
) -> OpRecord:
    return OpRecord(
        half=half,
        op=op,
        source=actor.source,
        actor=actor.name,
        reason=reason,
        detail=detail or {},
        at=at or timezone.now(),
    )
