"""A FIFO consumer group's receive (docs/decisions/0054): per topic and message group, messages
are handed out in commit-log order, one at a time. The next one of a group is not handed out
while an earlier one is in flight (received, or waiting for its redelivery); it waits as a HELD
delivery until the ack or the dead-letter step ends the earlier one. Messages without a group
are received as in any group, and one group's wait never holds up another's messages: they are
read past it (the cursor moves on; what waits is a HELD row of its own group).

Lock: new messages are read under the queue's cursor lock (consuming._take_new), so a queue's
messages become deliveries in order and a group's HELD rows are inserted by one receive at a
time. Releasing a HELD head needs no cursor lock: its UPDATE re-checks the row's state under its
row lock, so two receives never hand out the same head, and a group's next message is only
handed out once no delivery of the group is in flight."""

import secrets
from collections.abc import Iterable
from datetime import datetime

from django.db import connection

from apps.broker import failpoints, rows
from apps.broker.models import CommitLogEntry, ConsumerGroup, Delivery, DeliveryState, Topic
from apps.broker.services import handles
from apps.broker.services.queue_reads import ENTRIES_SQL, MOVE_CURSORS_SQL
from apps.broker.services.sending import notify_receivable

# Entries read past the answer's size from a queue on one receive: what lets a receive step over
# a stuck group's messages (held, not handed out) to reach the others behind them.
READ_AHEAD = 64

# A held delivery `h` whose group has nothing in flight: the next receive hands it out (also
# what a waiting receive's fallback check looks for, apps/broker/wakeups.py).
FREE_HELD = """
    h.state = 'HELD' AND NOT EXISTS (
        SELECT 1 FROM broker_delivery f
        WHERE f.group_id = h.group_id AND f.topic_id = h.topic_id
            AND f.message_group = h.message_group AND f.message_group <> ''
            AND f.state = 'INFLIGHT'
    )
"""
_FREE_HELD = f"h.group_id = %(group)s AND h.topic_id = %(topic)s AND {FREE_HELD}"
# Part of a FIFO group's "anything receivable?" read (consuming._receivable).
RELEASABLE_SQL = f"EXISTS (SELECT 1 FROM broker_delivery h WHERE {_FREE_HELD})"  # noqa: S608

# The first held message of each group with nothing in flight, in order of their messages.
_HEADS_SQL = f"""
SELECT id FROM (
    SELECT DISTINCT ON (h.message_group) h.id, h.message_id
    FROM broker_delivery h WHERE {_FREE_HELD}
    ORDER BY h.message_group, h.message_id
) heads
ORDER BY message_id
LIMIT %(limit)s
"""  # noqa: S608 - composed of constants only

# Handed out only if still held: a concurrent receive that released it first wins. Lock: the
# heads are locked in id order, skipping those another receive is releasing; two receives
# locking overlapping heads in the orders their plans chose would deadlock.
_RELEASE_SQL = """
WITH locked AS (
    SELECT id FROM broker_delivery WHERE id = ANY(%(ids)s::bigint[]) AND state = 'HELD'
    ORDER BY id FOR UPDATE SKIP LOCKED
)
UPDATE broker_delivery d SET state = 'INFLIGHT', attempts = d.attempts + 1,
    invisible_until = %(until)s, handle_token = r.token, last_received_at = %(now)s,
    first_received_at = coalesce(d.first_received_at, %(now)s)
FROM locked JOIN unnest(%(ids)s::bigint[], %(tokens)s::varchar[]) AS r(id, token)
    ON r.id = locked.id
WHERE d.id = locked.id
RETURNING d.id
"""

# The groups among `groups` that have a delivery in flight or held: their next message waits.
# Each half reads one of the partial indexes the conditions name (delivery_fifo_head_idx,
# delivery_held_idx).
_BUSY_SQL = """
SELECT message_group FROM broker_delivery
WHERE group_id = %(group)s AND topic_id = %(topic)s AND message_group = ANY(%(groups)s::varchar[])
    AND state = 'INFLIGHT' AND message_group <> ''
UNION
SELECT message_group FROM broker_delivery
WHERE group_id = %(group)s AND topic_id = %(topic)s AND message_group = ANY(%(groups)s::varchar[])
    AND state = 'HELD'
"""

_INSERT_SQL = f"""
WITH moved AS ({MOVE_CURSORS_SQL})
INSERT INTO broker_delivery (group_id, topic_id, message_id, state, attempts, invisible_until,
    handle_token, first_received_at, last_received_at, acked_at, dlq_at, message_group)
SELECT %(group)s, %(topic)s, m.message_id, m.state,
    CASE WHEN m.state = 'INFLIGHT' THEN 1 ELSE 0 END, %(until)s, m.token,
    CASE WHEN m.state = 'INFLIGHT' THEN %(now)s::timestamptz END,
    CASE WHEN m.state = 'INFLIGHT' THEN %(now)s::timestamptz END, NULL, NULL, m.message_group
FROM unnest(%(messages)s::bigint[], %(tokens)s::varchar[], %(states)s::varchar[],
    %(groups)s::varchar[]) WITH ORDINALITY AS m(message_id, token, state, message_group, i)
ORDER BY m.i
RETURNING id, message_id
"""  # noqa: S608 - composed of constants only


def release_heads(
    *, group: ConsumerGroup, topic: Topic, limit: int, invisible_until: datetime, now: datetime
) -> list[Delivery]:
    """Hands out the next message of each group whose earlier one was acked or dead-lettered."""
    if limit <= 0:
        return []
    with connection.cursor() as cursor:
        cursor.execute(_HEADS_SQL, {"group": group.pk, "topic": topic.pk, "limit": limit})
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return []
        if failpoints.ARMED:
            failpoints.hit("after_fifo_heads_read")
        cursor.execute(
            _RELEASE_SQL,
            {
                "ids": ids,
                "tokens": [secrets.token_hex(12) for _ in ids],
                "until": invisible_until,
                "now": now,
            },
        )
        released = [row[0] for row in cursor.fetchall()]
    deliveries = list(
        Delivery.objects.filter(pk__in=released).select_related("message").order_by("message_id")
    )
    for delivery in deliveries:
        delivery.message.topic = topic  # the answer names it: not one query per message
    return deliveries


def take_in_order(
    *,
    group: ConsumerGroup,
    topic: Topic,
    cursors: Iterable[tuple[int, int, int]],
    limit: int,
    tags: frozenset[str] | None,
    invisible_until: datetime,
    now: datetime,
) -> list[Delivery]:
    """New messages from the locked cursors' queues, each queue in offset order: handed out
    (at most `limit`), held behind an earlier message of their group, or passed over by the tag
    expression; the cursors move past all of them. Returns what is handed out."""
    chosen: list[tuple[CommitLogEntry, str]] = []  # (message, INFLIGHT or HELD)
    moved: list[tuple[int, int]] = []  # (cursor id, its next offset)
    handed = 0
    for cursor_id, queue_id, next_offset in cursors:
        if handed >= limit:
            break
        with connection.cursor() as cursor:
            cursor.execute(
                ENTRIES_SQL, [topic.pk, queue_id, next_offset, limit - handed + READ_AHEAD]
            )
            batch = [rows.load(CommitLogEntry, row) for row in cursor.fetchall()]
        if not batch:
            continue
        busy = _busy(group, topic, {e.message_group for e in batch if e.message_group})
        last = None
        for entry in batch:
            if handed >= limit:
                break
            last = entry
            if tags is not None and entry.tags not in tags:
                continue  # passed over for this group, as in RocketMQ
            if entry.message_group in busy:
                chosen.append((entry, DeliveryState.HELD))
                continue
            chosen.append((entry, DeliveryState.INFLIGHT))
            handed += 1
            if entry.message_group:
                busy.add(entry.message_group)
        if last is not None:
            moved.append((cursor_id, last.queue_offset + 1))
    if not moved:
        return []
    if any(state == DeliveryState.HELD for _, state in chosen):
        # The head a held message waits for may be acked before this receive commits, whose
        # NOTIFY then came too early for it: announce the topic again at this commit.
        notify_receivable(topic_id=topic.pk, what="held")
    return _insert(group, topic, chosen, moved, invisible_until, now)


def _busy(group: ConsumerGroup, topic: Topic, groups: set[str]) -> set[str]:
    if not groups:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(_BUSY_SQL, {"group": group.pk, "topic": topic.pk, "groups": sorted(groups)})
        return {row[0] for row in cursor.fetchall()}


def _insert(
    group: ConsumerGroup,
    topic: Topic,
    chosen: list[tuple[CommitLogEntry, str]],
    moved: list[tuple[int, int]],
    invisible_until: datetime,
    now: datetime,
) -> list[Delivery]:
    deliveries = []
    for message, state in chosen:
        message.topic = topic  # the answer names it: not one query per message
        delivery = Delivery(
            group=group,
            topic=topic,
            message=message,
            state=state,
            message_group=message.message_group,
            invisible_until=invisible_until,
            handle_token=secrets.token_hex(12),
        )
        if state == DeliveryState.INFLIGHT:
            handles.hand_out(delivery, invisible_until, now)
            delivery.first_received_at = now
        deliveries.append(delivery)
    with connection.cursor() as cursor:
        cursor.execute(
            _INSERT_SQL,
            {
                "group": group.pk,
                "topic": topic.pk,
                "until": invisible_until,
                "now": now,
                "messages": [d.message.pk for d in deliveries],
                "tokens": [d.handle_token for d in deliveries],
                "states": [d.state for d in deliveries],
                "groups": [d.message_group for d in deliveries],
                "cursor_ids": [m[0] for m in moved],
                "next_offsets": [m[1] for m in moved],
            },
        )
        ids = {message_id: pk for pk, message_id in cursor.fetchall()}
    handed_out = []
    for delivery in deliveries:
        delivery.pk = ids[delivery.message.pk]
        delivery._state.adding = False
        if delivery.state == DeliveryState.INFLIGHT:
            handed_out.append(delivery)
    return handed_out
