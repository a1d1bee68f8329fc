"""The life of a transactional (half) message: prepare, commit, rollback, park, resume.

Every path that changes a transaction's state, whoever calls it (REST, console, admin, check-back,
Celery), locks the half message's row first (half_rows.lock, or the plain commit's own statement)
and writes through `_apply`, or the commit statements of committing.py.
"""

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.broker import failpoints, limits
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
from apps.broker.services import committing, delivery, half_rows, prepare_rows
from apps.broker.services.client_ids import held, refuse_recalled, stored_id_for
from apps.broker.services.errors import BrokerError, Conflict, TransactionResolved
from apps.broker.services.sending import (
    OutgoingMessage,
    delayed_store,
    queue_for,
)
from apps.broker.storage_quota import check_storage_quota

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
    for attempt in range(4):
        # First as it is: a fresh id (a client's every first send) is stored by one statement,
        # whose claim refuses it if anything holds it (decision 0074). Then, or for a held id,
        # as decision 0040 says: the earlier answer, or this group's scoped id.
        if attempt and held(msg_id):
            stored_id = stored_id_for(client_id=msg_id, producer_group=producer_group.name)
            earlier = _half_by_client_id(stored_id, producer_group, topic)
            if earlier is not None:
                return earlier
        else:
            stored_id = msg_id
        if failpoints.ARMED:
            failpoints.hit("after_msg_id_check")
        item = Prepared(message, check_immunity_seconds, delay_level, deliver_at, stored_id)
        try:
            [half] = transaction_prepare_batch(
                producer_group=producer_group, topic=topic, items=[item], actor=actor
            )
            return half
        except IntegrityError:
            # The id is held after all (the claim, client_ids.claim_sql): a concurrent retry
            # stored it first, answer what it stored; or another group took it meanwhile, this
            # group's message takes its scoped id.
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
        refuse_recalled(msg_id=msg_id, producer_group=producer_group.name)
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
    for item in items:
        # A delay is checked here, whichever door asks (TXHUB_MAX_DELAY, none with a message
        # group), and applied from the commit on (docs/decisions/0117).
        delivery.delivery_time(
            message=item.message,
            delay_level=item.delay_level,
            deliver_at=item.deliver_at,
            start=now,
        )
    # A group at or over its storage quota stores nothing more (decision 0085), at every door.
    check_storage_quota(producer_group.name)
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
                queue_id=queue_for(
                    topic=topic, msg_id=msg_id, message_group=item.message.message_group
                ),
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
    prepare_rows.insert_prepared(
        halves, actor.source, actor.name, now, claim=[i.msg_id for i in items if i.msg_id]
    )
    if failpoints.ARMED:
        failpoints.hit_after_commit("after_half_insert")
    return halves


def transaction_commit(
    *,
    transaction_id: uuid.UUID,
    actor: Actor,
    reason: str = "",
    detail: dict[str, Any] | None = None,
    producer_groups: Collection[str] | None = None,
    now: datetime | None = None,
) -> Resolution:
    """`now`: the instant the commit decides with (whether a delay is due, resolved_at). A
    worker passes the database's (check-back, decision 0020); a web process its own clock."""
    resolution = None
    if not connection.in_atomic_block:
        committed = committing.commit_at_once(
            transaction_id,
            source=actor.source,
            actor=actor.name,
            reason=reason,
            detail=detail or {},
            producer_groups=producer_groups,
            now=now or timezone.now(),
        )
        resolution = None if committed is None else Resolution(*committed)
    if resolution is None:  # not the plain case (or inside a caller's transaction)
        resolution = _resolve(
            transaction_id, TransactionState.COMMITTED, actor, reason, detail, producer_groups, now
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
    now: datetime | None = None,
) -> Resolution:
    """`now` as for transaction_commit."""
    return _resolve(
        transaction_id, TransactionState.ROLLED_BACK, actor, reason, detail, producer_groups, now
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
        halves = {half.transaction_id: half for half in half_rows.lock_all(transaction_ids)}

        # Then the commits take their queue rows in (topic, queue) order, like every appending
        # transaction (sending.message_send_batch, the delayed delivery scan).
        def place(tid: uuid.UUID) -> tuple[int, int]:
            half = halves.get(tid)
            return (half.topic_id, half.queue_id) if half else (0, 0)

        now = timezone.now()
        plain: dict[tuple[int, int], list[HalfMessage]] = {}  # visible commits, by queue
        for tid in sorted(transaction_ids, key=place):
            try:
                half = half_rows.owned(halves.get(tid), tid, producer_groups)
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
            queue = plain[place_key]
            entries = committing.commit_locked(
                queue, source=actor.source, actor=actor.name, reason=reason, detail={}, now=now
            )
            for half, entry in zip(queue, entries, strict=True):
                committing.mark_committed(half, source=actor.source, now=now)
                outcomes[half.transaction_id] = Outcome(
                    half.transaction_id, Resolution(half, entry), None
                )
    if commit and failpoints.ARMED:
        failpoints.hit_after_commit("after_commit_before_answer")
    return [outcomes[tid] for tid in transaction_ids]


@transaction.atomic
def transaction_park(*, transaction_id: uuid.UUID, actor: Actor, reason: str) -> bool:
    """PREPARED -> PARKED: check-back gave up. Anything else is left as it is. True when this
    call parked it, False when it found the row in another state (resolved meanwhile), so a
    scan counts what it did (docs/decisions/0110)."""
    half = half_rows.lock(transaction_id, None)
    if half.state != TransactionState.PREPARED:
        return False
    half.state = TransactionState.PARKED
    half.next_check_at = None
    half.save(update_fields=["state", "next_check_at"])
    _record(half, OpKind.PARK, actor, reason=reason)
    return True


@transaction.atomic
def transaction_resume(*, transaction_id: uuid.UUID, actor: Actor, reason: str = "") -> HalfMessage:
    """PARKED -> PREPARED with the check count reset, so check-back asks again."""
    half = half_rows.lock(transaction_id, None)
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
    now: datetime | None = None,
) -> Resolution:
    half = half_rows.lock(transaction_id, producer_groups)
    return _apply(half, target, actor, reason, detail, now)


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
    # between must not be committed here, out of the batch's queue lock order. Check-back passes
    # the database's: a worker's clock never decides what is due (docs/decisions/0020).
    now = now or timezone.now()
    half.state = target
    half.resolved_at = now
    half.resolved_by = actor.source
    half.next_check_at = None
    count_resolution(outcome=target, resolved_by=actor.source)
    if target == TransactionState.COMMITTED:
        due = _delivery_due(half, now)
        if due is None:
            [entry] = committing.commit_locked(
                [half],
                source=actor.source,
                actor=actor.name,
                reason=reason,
                detail=detail or {},
                now=now,
            )
            return Resolution(half, entry)
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


def _delivery_due(half: HalfMessage, now: datetime) -> datetime | None:
    if half.delay_seconds:
        return now + timedelta(seconds=half.delay_seconds)
    if half.deliver_at and half.deliver_at > now:
        return half.deliver_at
    return None


def _outgoing(half: HalfMessage) -> OutgoingMessage:
    return OutgoingMessage.of(half, half.producer_group.name)


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
    record = OpRecord(
        half=half,
        op=op,
        source=actor.source,
        actor=actor.name,
        reason=reason,
        detail=detail or {},
        at=at or timezone.now(),
    )
    record.save(force_insert=True)
    return record
