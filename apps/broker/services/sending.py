"""Appending visible messages to the commit log, and normal (non-transactional) sends."""

import contextlib
import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.broker import failpoints
from apps.broker.models import (
    CommitLogEntry,
    DelayedMessage,
    HalfMessage,
    MessageFields,
    Topic,
    new_msg_id,
)
from apps.broker.services.client_ids import stored_id_for
from apps.broker.services.errors import Conflict


@dataclass(frozen=True)
class OutgoingMessage:
    """A message as the producer sent it, already validated against the contract's limits."""

    producer_group: str
    body: bytes
    body_is_binary: bool
    tags: str = ""
    keys: list[str] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)

    def row_fields(self) -> dict[str, Any]:
        """The columns every stored copy of a message has (half, delayed, commit log)."""
        return {
            "tags": self.tags,
            "keys": self.keys,
            "properties": self.properties,
            "body": self.body,
            "body_is_binary": self.body_is_binary,
        }

    @classmethod
    def of(cls, row: MessageFields, producer_group: str) -> "OutgoingMessage":
        """The message again, from a stored copy (to move it on: delayed -> commit log)."""
        return cls(
            producer_group=producer_group,
            body=bytes(row.body),
            body_is_binary=row.body_is_binary,
            tags=row.tags,
            keys=row.keys,
            properties=row.properties,
        )


def queue_for(*, topic: Topic, msg_id: str) -> int:
    # msg_id is random, so this spreads messages evenly over the queues with no shared state.
    # A RocketMQ client's id is hex too ("01" + host, process, time and a counter).
    try:
        return int(msg_id, 16) % topic.queues
    except ValueError:  # a client-made id that is not hex: any stable spread will do
        return int(hashlib.sha256(msg_id.encode()).hexdigest()[:8], 16) % topic.queues


# The channel every message that becomes receivable is announced on; waiting consumers are woken
# from it (apps/broker/wakeups.py, docs/decisions/0024). The payload starts with the topic id.
RECEIVABLE_CHANNEL = "txhub_receivable"

# Hands out a queue's next offset. The UPDATE keeps the queue row locked until the caller's
# transaction commits. Lock: without it two concurrent commits could make offset N+1 visible
# before N, and a consumer that has read N+1 would skip N for ever (CONTRACT invariant 5).
# Every message becomes receivable here (send, commit, delayed delivery), so this is also where
# it is announced: the NOTIFY is part of the transaction, delivered to listeners when (and only
# if) it commits, with no extra round trip. One payload per message ("topic queue offset"), so
# Postgres does not fold them and the listener knows how many arrived.
NEXT_QUEUE_OFFSET_SQL = (
    "UPDATE broker_messagequeue SET next_offset = next_offset + 1 "
    "WHERE topic_id = %(topic_id)s AND queue_id = %(queue_id)s "
    "RETURNING next_offset - 1 AS queue_offset, "
    "pg_notify('txhub_receivable', concat_ws(' ', topic_id, queue_id, next_offset - 1))"
)
assert RECEIVABLE_CHANNEL in NEXT_QUEUE_OFFSET_SQL  # noqa: S101 - one name, spelled twice


def notify_receivable(*, topic_id: int, what: str) -> None:
    """Announces, at the commit of the caller's transaction, that something on the topic became
    receivable other than through a new offset (a dead letter sent back)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_notify(%s, concat_ws(' ', %s::bigint, %s::text))",
            [RECEIVABLE_CHANNEL, topic_id, what],
        )


def next_queue_offset(*, topic_id: int, queue_id: int) -> int:
    """The queue's next offset; the queue row stays locked until the caller's transaction ends."""
    with connection.cursor() as cursor:
        cursor.execute(NEXT_QUEUE_OFFSET_SQL, {"topic_id": topic_id, "queue_id": queue_id})
        row = cursor.fetchone()
    assert row is not None, "every topic has a counter row per queue"  # noqa: S101
    return int(row[0])


def commit_log_append(
    *,
    topic: Topic,
    queue_id: int,
    msg_id: str,
    message: OutgoingMessage,
    born_at: datetime | None = None,
    transaction_id: uuid.UUID | None = None,
) -> CommitLogEntry:
    """Must run inside the caller's transaction: the offset lock is released by its commit."""
    now = timezone.now()
    return CommitLogEntry.objects.create(
        msg_id=msg_id,
        topic=topic,
        queue_id=queue_id,
        queue_offset=next_queue_offset(topic_id=topic.pk, queue_id=queue_id),
        producer_group=message.producer_group,
        transaction_id=transaction_id,
        **message.row_fields(),
        born_at=born_at or now,
        stored_at=now,
    )


# TAKE_OFFSETS_SQL takes `n` offsets of one queue (and announces them with one NOTIFY whose
# payload ends with their number), as a CTE of APPEND_SQL and of a batch commit's statement.
TAKE_OFFSETS_SQL = f"""
    UPDATE broker_messagequeue SET next_offset = next_offset + %(n)s
    WHERE topic_id = %(topic_id)s AND queue_id = %(queue_id)s
    RETURNING next_offset - %(n)s AS first_offset,
        pg_notify('{RECEIVABLE_CHANNEL}',
            concat_ws(' ', topic_id, queue_id, next_offset - %(n)s, %(n)s))
"""  # noqa: S608 - a constant

# Appends messages to one queue in one statement: takes as many offsets as there are messages
# (the queue row stays locked until the transaction ends: see NEXT_QUEUE_OFFSET_SQL), inserts them
# in the order given, and announces them with one NOTIFY whose payload ends with their number.
# Composed of constants only; every value is bound by the server.
APPEND_SQL = f"""
WITH queue AS ({TAKE_OFFSETS_SQL})
INSERT INTO broker_commitlogentry (msg_id, queue_id, tags, keys, properties, body,
    body_is_binary, born_at, queue_offset, producer_group, transaction_id, stored_at, topic_id)
SELECT m.msg_id, %(queue_id)s, m.tags, m.keys::jsonb, m.properties::jsonb, m.body,
    m.body_is_binary, %(now)s, queue.first_offset + m.i - 1, m.producer_group, NULL, %(now)s,
    %(topic_id)s
FROM queue, unnest(%(msg_ids)s::varchar[], %(tags)s::varchar[], %(keys)s::text[],
    %(properties)s::text[], %(bodies)s::bytea[], %(binary)s::bool[], %(groups)s::varchar[])
    WITH ORDINALITY AS m(msg_id, tags, keys, properties, body, body_is_binary, producer_group, i)
RETURNING msg_id, queue_offset
"""  # noqa: S608


def _append_to_queue(
    topic: Topic,
    queue_id: int,
    msg_ids: list[str],
    messages: list[OutgoingMessage],
    now: datetime,
) -> list[int]:
    """The queue offsets of `messages`, appended to one queue in this order."""
    with connection.cursor() as cursor:
        cursor.execute(
            APPEND_SQL,
            {
                "n": len(messages),
                "topic_id": topic.pk,
                "queue_id": queue_id,
                "now": now,
                "msg_ids": msg_ids,
                "tags": [m.tags for m in messages],
                "keys": [json.dumps(m.keys) for m in messages],
                "properties": [json.dumps(m.properties) for m in messages],
                "bodies": [m.body for m in messages],
                "binary": [m.body_is_binary for m in messages],
                "groups": [m.producer_group for m in messages],
            },
        )
        offsets = dict(cursor.fetchall())
    assert len(offsets) == len(msg_ids), "every topic has a counter row per queue"  # noqa: S101
    return [offsets[msg_id] for msg_id in msg_ids]


@dataclass(frozen=True)
class Sent:
    msg_id: str
    topic: Topic
    queue_id: int
    queue_offset: int | None  # None while the message waits for its delivery time
    deliver_at: datetime


def message_send(
    *,
    topic: Topic,
    message: OutgoingMessage,
    deliver_at: datetime | None = None,
    msg_id: str | None = None,
) -> Sent:
    """A normal send, visible at once or (delayed) at `deliver_at`. The 201 is sent only after
    this transaction committed.

    `msg_id`: the producer's own message id (a RocketMQ client's), scoped to its producer group
    (services/client_ids.py); a retry with the same id answers what the first send stored and
    stores nothing (see `message_by_client_id`)."""
    if msg_id is None:
        [sent] = message_send_batch(topic=topic, messages=[(message, deliver_at)])
        return sent
    for _ in range(3):
        stored_id = stored_id_for(client_id=msg_id, producer_group=message.producer_group)
        earlier = message_by_client_id(msg_id=stored_id, topic=topic, message=message)
        if earlier is not None:
            return earlier
        try:
            [sent] = message_send_batch(
                topic=topic, messages=[(message, deliver_at)], msg_ids=[stored_id]
            )
            return sent
        except IntegrityError:
            # A concurrent retry stored it first (unique msg_id): answer what it stored; or
            # another group took the id meanwhile: this group's message takes its scoped id.
            continue
    raise Conflict(f"Message id {msg_id} is in use.")


def message_by_client_id(*, msg_id: str, topic: Topic, message: OutgoingMessage) -> Sent | None:
    """The message a producer already stored under its own id, or None. The same id used for
    another of the group's topics, or by one of its transactions, is a conflict; another group's
    message under it (a race with `stored_id_for`) is a conflict that says nothing about it."""

    def owned(row: CommitLogEntry | DelayedMessage) -> None:
        if row.producer_group != message.producer_group:
            raise Conflict(f"Message id {msg_id} is in use.")
        if row.topic_id != topic.pk:
            raise Conflict(f"Message id {msg_id} is in use by another message.")
        if row.transaction_id is not None:
            raise Conflict(f"Message id {msg_id} is in use by a transaction.")

    entry = CommitLogEntry.objects.filter(msg_id=msg_id).first()
    if entry is not None:
        owned(entry)
        return Sent(msg_id, topic, entry.queue_id, entry.queue_offset, entry.stored_at)
    delayed = DelayedMessage.objects.filter(msg_id=msg_id).first()
    if delayed is not None:
        owned(delayed)
        return Sent(msg_id, topic, delayed.queue_id, None, delayed.deliver_at)
    half = HalfMessage.objects.filter(msg_id=msg_id)
    if half.filter(producer_group__name=message.producer_group).exists():
        raise Conflict(f"Message id {msg_id} is in use by a transaction.")
    if half.exists():
        raise Conflict(f"Message id {msg_id} is in use.")
    return None


def delayed_store(
    *,
    topic_id: int,
    queue_id: int,
    msg_id: str,
    message: OutgoingMessage,
    deliver_at: datetime,
    born_at: datetime,
    transaction_id: uuid.UUID | None = None,
) -> DelayedMessage:
    """A message stored to wait for its delivery time (delivery.py moves it to the log)."""
    return DelayedMessage.objects.create(
        msg_id=msg_id,
        topic_id=topic_id,
        queue_id=queue_id,
        producer_group=message.producer_group,
        transaction_id=transaction_id,
        **message.row_fields(),
        born_at=born_at,
        deliver_at=deliver_at,
    )


def message_send_batch(
    *,
    topic: Topic,
    messages: list[tuple[OutgoingMessage, datetime | None]],
    msg_ids: list[str] | None = None,
) -> list[Sent]:
    """Normal sends, all stored in one transaction or none; answers in the order given.

    Appended in queue order: each queue's offset row stays locked until the commit, and two
    batches (or a batch and a producer's commit) that take queue locks in the same order cannot
    deadlock. Offsets within a queue follow the order of the batch."""
    msg_ids = msg_ids or [new_msg_id() for _ in messages]
    queues = [queue_for(topic=topic, msg_id=msg_id) for msg_id in msg_ids]
    now = timezone.now()
    sent: list[Sent | None] = [None] * len(messages)
    visible: dict[int, list[int]] = {}  # queue -> indexes of the batch, in batch order
    for i in range(len(messages)):
        if messages[i][1] is None:
            visible.setdefault(queues[i], []).append(i)
    # One statement, and so one transaction, when nothing is delayed and one queue is touched.
    # (Inside a caller's transaction, a savepoint all the same: a duplicate msg_id, answered by
    # message_send's retry, must not abort the caller's transaction.)
    single = len(visible) == 1 and len(visible[queues[0]]) == len(messages)
    alone = single and not connection.in_atomic_block
    with contextlib.nullcontext() if alone else transaction.atomic():
        for i, (message, deliver_at) in enumerate(messages):
            if deliver_at is not None:
                delayed_store(
                    topic_id=topic.pk,
                    queue_id=queues[i],
                    msg_id=msg_ids[i],
                    message=message,
                    deliver_at=deliver_at,
                    born_at=now,
                )
                sent[i] = Sent(msg_ids[i], topic, queues[i], None, deliver_at)
        for queue_id in sorted(visible):
            indexes = visible[queue_id]
            offsets = _append_to_queue(
                topic,
                queue_id,
                [msg_ids[i] for i in indexes],
                [messages[i][0] for i in indexes],
                now,
            )
            for i, offset in zip(indexes, offsets, strict=True):
                sent[i] = Sent(msg_ids[i], topic, queue_id, offset, now)
    if failpoints.ARMED:
        failpoints.hit_after_commit("after_send_before_answer")
    return [item for item in sent if item is not None]
