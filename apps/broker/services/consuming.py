"""Consumers (RocketMQ 5 SimpleConsumer): receive with an invisible time, ack, change the
invisible time, dead-letter queue and resend. At least once per consumer group."""

import random
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.broker import failpoints, rows
from apps.broker.models import (
    CommitLogEntry,
    ConsumeFrom,
    ConsumerCursor,
    ConsumerGroup,
    Delivery,
    DeliveryState,
    MessageQueue,
    Topic,
)
from apps.broker.services import dead_letters, fifo, group_locks, handles, retention
from apps.broker.services.errors import invalid
from apps.broker.services.queue_reads import ENTRIES_SQL, MOVE_CURSORS_SQL
from apps.broker.services.sending import RECEIVABLE_CHANNEL


@dataclass(frozen=True)
class Received:
    delivery: Delivery
    message: CommitLogEntry

    @property
    def receipt_handle(self) -> str:
        return handles.receipt_handle_of(self.delivery)


def message_receive(
    *,
    group: ConsumerGroup,
    topic: Topic,
    max_messages: int,
    invisible_seconds: int,
    tags: frozenset[str] | None = None,
) -> list[Received]:
    """Expired in-flight messages first (redelivery), then new ones; one try. A receive that may
    wait (long polling) is apps/broker/waiting.py's, for both doors (decision 0047)."""
    received, _ = _receive_once(group, topic, max_messages, invisible_seconds, tags)
    return received


@dataclass(frozen=True)
class WaitPlan:
    """A receive that may wait (apps/broker/waiting.py, both doors): what it asks for, whose it
    is (`token_id`: its revocation ends the wait) and, once its first try found nothing, `seen`:
    the number of wake-ups for the topic this process had seen before that try (one that arrived
    since then may announce what the try missed)."""

    group: ConsumerGroup
    topic: Topic
    max_messages: int
    invisible_seconds: int
    wait_seconds: float
    tags: frozenset[str] | None
    token_id: int | None = None
    seen: int = 0


def receive_now(plan: WaitPlan) -> tuple[list[Received], bool]:
    """One try, no waiting: what was received, and whether anything at all was receivable (False:
    no new offset, no expired delivery; the wake-up hub may remember that, waiting.first_try)."""
    return _receive_once(
        plan.group, plan.topic, plan.max_messages, plan.invisible_seconds, plan.tags
    )


def receive_once(plan: WaitPlan) -> list[Received]:
    """One more try of a waiting receive (woken, or its fallback check found something)."""
    return receive_now(plan)[0]


def _receive_once(
    group: ConsumerGroup,
    topic: Topic,
    max_messages: int,
    invisible_seconds: int,
    tags: frozenset[str] | None,
) -> tuple[list[Received], bool]:
    # Nothing there (the common answer to a consumer that polls): said by one read, without the
    # row locks below, whose commit would be a WAL flush per empty receive (decision 0025).
    now = timezone.now()
    place = _receivable(group, topic, now, tags)
    if not place.anything:
        return [], False
    return _receive_locked(group, topic, max_messages, invisible_seconds, tags, place), True


@dataclass(frozen=True)
class Receivable:
    """What one read found: cursors missing (a first receive), new offsets, expired deliveries."""

    cursors_missing: bool
    new: bool
    expired: bool
    releasable: bool = False  # a FIFO group's held message whose group is free (fifo.py)

    @property
    def anything(self) -> bool:
        return self.cursors_missing or self.new or self.expired or self.releasable


@transaction.atomic
def _receive_locked(
    group: ConsumerGroup,
    topic: Topic,
    max_messages: int,
    invisible_seconds: int,
    tags: frozenset[str] | None,
    place: Receivable,
) -> list[Received]:
    # On one Postgres a receive's commit does not wait for its WAL flush (docs/decisions/0025):
    # if Postgres crashes before the flush, the receive is undone and the message is delivered
    # again, as at-least-once allows. An ack can never outlive its receive: WAL is flushed in
    # order. On a replicated cluster it waits like every write: an old primary woken after a
    # failover must not hand out a message the new one has seen acked (decision 0050).
    # Lock: the group's row, shared, against its deletion (group_locks.py, decision 0088).
    group_locks.hold_for_receive(group=group, synchronous=settings.TXHUB_RECEIVE_SYNCHRONOUS_COMMIT)
    now = timezone.now()
    invisible_until = now + timedelta(seconds=invisible_seconds)
    received: list[Received] = []
    if place.expired:
        received = _redeliver(group, topic, max_messages, invisible_until, tags, now)
    if group.fifo:
        # A group's held message before any new one: it came first (decision 0054).
        released = fifo.release_heads(
            group=group,
            topic=topic,
            limit=max_messages - len(received),
            invisible_until=invisible_until,
            now=now,
        )
        received += [Received(d, d.message) for d in released]
    if len(received) < max_messages and (place.new or place.cursors_missing):
        received += _take_new(
            group,
            topic,
            max_messages - len(received),
            invisible_until,
            tags,
            now,
            place.cursors_missing,
        )
    return received


# The group's first receive from the topic (its cursors are made under the lock path), a queue
# beyond the group's cursor, or an in-flight message whose invisible time is over (which also
# covers exhausted ones that the full receive moves to the dead-letter queue).
_RECEIVABLE_TEMPLATE = """
SELECT (
    SELECT count(*) FROM broker_consumercursor
    WHERE group_id = %(group)s AND topic_id = %(topic)s
) <> %(queues)s, EXISTS (
    SELECT 1 FROM broker_consumercursor c
    JOIN broker_messagequeue q ON q.topic_id = c.topic_id AND q.queue_id = c.queue_id
    WHERE c.group_id = %(group)s AND c.topic_id = %(topic)s AND q.next_offset > c.next_offset
), EXISTS (
    SELECT 1 FROM broker_delivery d{join_messages}
    WHERE d.group_id = %(group)s AND d.topic_id = %(topic)s AND d.state = 'INFLIGHT'
        AND d.invisible_until <= %(now)s{of_its_tags}
)
"""
_RECEIVABLE_SQL = _RECEIVABLE_TEMPLATE.format(join_messages="", of_its_tags="")
# A receive with a tag filter: only an expired message it would take counts (decision 0081).
# Expired ones it passes over are not its to redeliver, and an exhausted one among them reaches
# the dead-letter queue by the periodic scan (dead_letters.deliveries_expire), not by this
# receive: counted, they made every such receive a write transaction that took nothing. The
# filter is one string, its tags joined by '|', which no tag holds (limits.check_tag), split
# once by Postgres: a list parameter cost more to send than the rest of the read's change.
_RECEIVABLE_TAGGED_SQL = _RECEIVABLE_TEMPLATE.format(
    join_messages=" JOIN broker_commitlogentry m ON m.offset = d.message_id",
    of_its_tags=" AND m.tags = ANY((SELECT string_to_array(%(tags)s, '|'))::text[])",
)
# (FIFO group, tag filter) -> the read.
_RECEIVABLE_READS = {
    (False, False): _RECEIVABLE_SQL,
    (False, True): _RECEIVABLE_TAGGED_SQL,
    (True, False): f"{_RECEIVABLE_SQL}, {fifo.RELEASABLE_SQL}",
    (True, True): f"{_RECEIVABLE_TAGGED_SQL}, {fifo.RELEASABLE_SQL}",
}


def _receivable(
    group: ConsumerGroup, topic: Topic, now: datetime, tags: frozenset[str] | None
) -> Receivable:
    with connection.cursor() as cursor:
        cursor.execute(
            _RECEIVABLE_READS[(group.fifo, tags is not None)],
            {
                "group": group.pk,
                "topic": topic.pk,
                "queues": topic.queues,
                "now": now,
                "tags": None if tags is None else "|".join(tags),
            },
        )
        row = cursor.fetchone()
    assert row is not None  # noqa: S101 - a SELECT of three or four expressions has one row
    return Receivable(*(bool(value) for value in row))


def _redeliver(
    group: ConsumerGroup,
    topic: Topic,
    limit: int,
    invisible_until: datetime,
    tags: frozenset[str] | None,
    now: datetime,
) -> list[Received]:
    dead_letters.dead_letter_exhausted(group=group, topic=topic, now=now)
    due = Delivery.objects.filter(
        group=group, topic=topic, state=DeliveryState.INFLIGHT, invisible_until__lte=now
    )
    if tags is not None:
        due = due.filter(message__tags__in=tags)
    # Lock, SKIP LOCKED: two consumers of one group never take the same expired message at once.
    deliveries = list(
        due.select_for_update(skip_locked=True, of=("self",))
        .select_related("message")
        .order_by("invisible_until")[:limit]
    )
    for delivery in deliveries:
        handles.hand_out(delivery, invisible_until, now)
    Delivery.objects.bulk_update(
        deliveries, ["attempts", "invisible_until", "handle_token", "last_received_at"]
    )
    for delivery in deliveries:
        delivery.message.topic = topic  # the answer names it: not one query per message
    return [Received(d, d.message) for d in deliveries]


# Plain SQL from here to the end of _take_new: the hottest read path (decision 0025).
_CURSORS_SQL = (
    "SELECT id, queue_id, next_offset FROM broker_consumercursor "
    "WHERE group_id = %s AND topic_id = %s ORDER BY queue_id FOR UPDATE SKIP LOCKED"
)
_CURSORS_WAIT_SQL = _CURSORS_SQL.replace(" FOR UPDATE SKIP LOCKED", " LIMIT 1 FOR UPDATE")
# Each queue's messages from its cursor on (at most `limit` from each), the queues in the
# order given, the first `limit` of them all: one statement for every queue of the topic.
_ENTRIES_OF_ALL_SQL = f"""
SELECT q.cursor_id, {rows.columns(CommitLogEntry, "e")}
FROM unnest(%(cursor_ids)s::bigint[], %(queue_ids)s::int[], %(offsets)s::bigint[])
    WITH ORDINALITY AS q(cursor_id, queue_id, next_offset, ord),
LATERAL (
    SELECT {rows.columns(CommitLogEntry, "x")} FROM broker_commitlogentry x
    WHERE x.topic_id = %(topic)s AND x.queue_id = q.queue_id AND x.queue_offset >= q.next_offset
    ORDER BY x.queue_offset LIMIT %(limit)s
) e
ORDER BY q.ord, e.queue_offset
LIMIT %(limit)s
"""  # noqa: S608
# The deliveries inserted and the cursors moved past them, in one statement.
_DELIVERIES_SQL = f"""
WITH moved AS ({MOVE_CURSORS_SQL})
INSERT INTO broker_delivery (group_id, topic_id, message_id, state, attempts, invisible_until,
    handle_token, first_received_at, last_received_at, acked_at, dlq_at)
SELECT %(group)s, %(topic)s, m.message_id, %(state)s, 1, %(until)s, m.token, %(now)s, %(now)s,
    NULL, NULL
FROM unnest(%(messages)s::bigint[], %(tokens)s::varchar[])
    WITH ORDINALITY AS m(message_id, token, i)
ORDER BY m.i
RETURNING id, message_id
"""  # noqa: S608 - composed of constants only


def _take_new(
    group: ConsumerGroup,
    topic: Topic,
    limit: int,
    invisible_until: datetime,
    tags: frozenset[str] | None,
    now: datetime,
    cursors_missing: bool = True,
) -> list[Received]:
    if cursors_missing:
        _ensure_cursors(group, topic)
    # Lock, SKIP LOCKED: two consumers of one group must not take the same offsets from a queue;
    # a consumer that finds a queue busy reads the other queues instead of waiting.
    with connection.cursor() as cursor:
        cursor.execute(_CURSORS_SQL, [group.pk, topic.pk])
        cursors = cursor.fetchall()
        if not cursors:
            # Every queue is being read by another consumer of the group (its receive holds
            # the cursors for a few milliseconds): wait for one rather than answer nothing while
            # messages are there. Answering nothing would send this consumer to wait for a
            # NOTIFY that no new message may ever send, until the fallback check. Same lock
            # order (queue_id) as every receive: no deadlock.
            cursor.execute(_CURSORS_WAIT_SQL, [group.pk, topic.pk])
            # Then whatever else is free by now (the one we hold is ours to read again).
            cursor.execute(_CURSORS_SQL, [group.pk, topic.pk])
            cursors = cursor.fetchall()
    random.shuffle(cursors)  # noqa: S311 - fairness between queues, not security
    if group.fifo:
        handed = fifo.take_in_order(
            group=group,
            topic=topic,
            cursors=cursors,
            limit=limit,
            tags=tags,
            invisible_until=invisible_until,
            now=now,
        )
        return [Received(d, d.message) for d in handed]
    if tags is None:
        taken, moved = _entries_of_all(topic, cursors, limit)
    else:
        taken, moved = _entries_queue_by_queue(topic, cursors, limit, tags)
    if not moved:
        return []
    deliveries = _insert_deliveries(group, topic, taken, invisible_until, now, moved)
    return [Received(d, d.message) for d in deliveries]


def _entries_queue_by_queue(
    topic: Topic, cursors: list[tuple[int, int, int]], limit: int, tags: frozenset[str]
) -> tuple[list[CommitLogEntry], list[tuple[int, int]]]:
    """The messages to hand out, queue after queue in the cursors' order, and each read queue's
    cursor id with its next offset. Messages the tag expression filters out are passed over for
    this group (the cursor moves past them), as in RocketMQ."""
    taken: list[CommitLogEntry] = []
    moved: list[tuple[int, int]] = []  # (cursor id, its next offset)
    for cursor_id, queue_id, next_offset in cursors:
        if len(taken) >= limit:
            break
        # Offsets below the queue counter are all committed (see sending.take_offsets), so reading
        # ">= cursor" in order can never step over a message that commits later.
        with connection.cursor() as cursor:
            cursor.execute(ENTRIES_SQL, [topic.pk, queue_id, next_offset, limit - len(taken)])
            batch = [rows.load(CommitLogEntry, row) for row in cursor.fetchall()]
        if not batch:
            continue
        taken += [m for m in batch if m.tags in tags]
        moved.append((cursor_id, batch[-1].queue_offset + 1))
    return taken, moved


def _entries_of_all(
    topic: Topic, cursors: list[tuple[int, int, int]], limit: int
) -> tuple[list[CommitLogEntry], list[tuple[int, int]]]:
    """What `_entries_queue_by_queue` takes when nothing is filtered out, read in one statement
    instead of one per queue: each queue's messages from its cursor on, the queues in the
    cursors' order, the first `limit` of them all."""
    if not cursors:
        return [], []
    with connection.cursor() as cursor:
        cursor.execute(
            _ENTRIES_OF_ALL_SQL,
            {
                "topic": topic.pk,
                "cursor_ids": [c[0] for c in cursors],
                "queue_ids": [c[1] for c in cursors],
                "offsets": [c[2] for c in cursors],
                "limit": limit,
            },
        )
        found = cursor.fetchall()
    taken = [rows.load(CommitLogEntry, row, 1) for row in found]
    next_offsets: dict[int, int] = {}  # cursor id -> its next offset, in the order read
    for row, entry in zip(found, taken, strict=True):
        next_offsets[row[0]] = entry.queue_offset + 1
    return taken, list(next_offsets.items())


def _insert_deliveries(
    group: ConsumerGroup,
    topic: Topic,
    messages: list[CommitLogEntry],
    invisible_until: datetime,
    now: datetime,
    moved: list[tuple[int, int]],
) -> list[Delivery]:
    """The deliveries of `messages` stored and the read cursors moved (`moved`: cursor id, next
    offset), in one statement."""
    move = {"cursor_ids": [m[0] for m in moved], "next_offsets": [m[1] for m in moved]}
    if not messages:  # all passed over by the tag expression: only the cursors move
        with connection.cursor() as cursor:
            cursor.execute(MOVE_CURSORS_SQL, move)
        return []
    deliveries = []
    for message in messages:
        message.topic = topic  # the answer names it: not one query per message
        delivery = Delivery(group=group, topic=topic, message=message, first_received_at=now)
        handles.hand_out(delivery, invisible_until, now)
        deliveries.append(delivery)
    with connection.cursor() as cursor:
        cursor.execute(
            _DELIVERIES_SQL,
            {
                "group": group.pk,
                "topic": topic.pk,
                "state": DeliveryState.INFLIGHT,
                "until": invisible_until,
                "now": now,
                "messages": [m.pk for m in messages],
                "tokens": [d.handle_token for d in deliveries],
                **move,
            },
        )
        ids = {message_id: pk for pk, message_id in cursor.fetchall()}
    for delivery in deliveries:
        delivery.pk = ids[delivery.message_id]
        delivery._state.adding = False
    return deliveries


def _ensure_cursors(group: ConsumerGroup, topic: Topic) -> None:
    if ConsumerCursor.objects.filter(group=group, topic=topic).count() == topic.queues:
        return
    # The retention sweep keeps the topic's rows while its new cursors are made (decision 0080).
    retention.hold_for_new_cursors(topic_id=topic.pk)
    queues = MessageQueue.objects.filter(topic=topic)
    ConsumerCursor.objects.bulk_create(
        [
            ConsumerCursor(
                group=group,
                topic=topic,
                queue_id=q.queue_id,
                next_offset=q.next_offset if group.consume_from == ConsumeFrom.LAST else 0,
            )
            for q in queues
        ],
        ignore_conflicts=True,  # a concurrent first receive created them already
    )


# The handles name their deliveries' ids. The group's condition is served by its in-flight index at
# most (what the group holds now), never by an index with the group's whole history: there is
# none (decision 0030).
# An ack in a FIFO group frees the message's group: its next message is receivable, announced
# at the commit as a new message is (decision 0054).
_ACK_SQL = f"""
WITH acked AS (
    UPDATE broker_delivery SET state = %(acked)s, acked_at = %(now)s
    WHERE {handles.LIVE_SQL} RETURNING id, handle_token, topic_id, message_group
)
SELECT id, handle_token, CASE WHEN message_group <> '' THEN
    pg_notify('{RECEIVABLE_CHANNEL}', concat_ws(' ', topic_id, 'released')) END
FROM acked
"""  # noqa: S608 - composed of constants only


def message_ack(*, group: ConsumerGroup, receipt_handles: list[str]) -> tuple[list[str], list[str]]:
    """Returns (acked, invalid). An expired, reused or unknown handle is invalid, never an error."""
    parsed = {handle: handles.parse_handle(handle) for handle in receipt_handles}
    pairs = [p for p in parsed.values() if p is not None]
    acked_pairs: set[tuple[int, str]] = set()
    if pairs:
        # One conditional UPDATE for the whole batch (one WAL flush, not one per handle): a handle
        # acks only while its receive is the latest and unexpired, re-checked under the row lock.
        with connection.cursor() as cursor:
            cursor.execute(
                _ACK_SQL,
                {
                    "acked": DeliveryState.ACKED,
                    "now": timezone.now(),
                    "group": group.pk,
                    "inflight": DeliveryState.INFLIGHT,
                    "ids": [p[0] for p in pairs],
                    "tokens": [p[1] for p in pairs],
                },
            )
            acked_pairs = {(row[0], row[1]) for row in cursor.fetchall()}
        if failpoints.ARMED:
            failpoints.hit_after_commit("after_ack_before_answer")
    acked = [h for h, p in parsed.items() if p in acked_pairs]
    acked_set = set(acked)
    return acked, [h for h in receipt_handles if h not in acked_set]


@transaction.atomic
def message_change_invisible(
    *, group: ConsumerGroup, receipt_handle: str, invisible_seconds: int
) -> Received:
    now = timezone.now()
    # Lock: an ack or a redelivery racing with this change sees either the old or new handle.
    delivery = (
        handles.live(group=group, handle=receipt_handle, now=now)
        .select_for_update(of=("self",))
        .select_related("message")
        .first()
    )
    if delivery is None:
        raise invalid("receipt_handle", "The receipt handle is expired or unknown.")
    delivery.invisible_until = now + timedelta(seconds=invisible_seconds)
    delivery.handle_token = secrets.token_hex(12)
    delivery.save(update_fields=["invisible_until", "handle_token"])
    return Received(delivery, delivery.message)
