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
from apps.broker.services.client_ids import (
    claim_ids,
    claim_sql,
    held,
    refuse_recalled,
    stored_id_for,
)
from apps.broker.services.errors import Conflict
from apps.broker.storage_quota import check_storage_quota


@dataclass(frozen=True)
class OutgoingMessage:
    """A message as the producer sent it, already validated against the contract's limits."""

    producer_group: str
    body: bytes
    body_is_binary: bool
    tags: str = ""
    keys: list[str] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    message_group: str = ""  # "" for none (docs/decisions/0054)

    def row_fields(self) -> dict[str, Any]:
        """The columns every stored copy of a message has (half, delayed, commit log)."""
        return {
            "tags": self.tags,
            "keys": self.keys,
            "properties": self.properties,
            "body": self.body,
            "body_is_binary": self.body_is_binary,
            "message_group": self.message_group,
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
            message_group=row.message_group,
        )


def queue_for(*, topic: Topic, msg_id: str, message_group: str = "") -> int:
    # A message group's messages all go to one queue, so that its offsets hold their order
    # (docs/decisions/0054): a stable hash of the group (a topic's queue count never changes).
    if message_group:
        return int(hashlib.sha256(message_group.encode()).hexdigest()[:8], 16) % topic.queues
    # msg_id is random, so this spreads messages evenly over the queues with no shared state.
    # A RocketMQ client's id is hex too ("01" + host, process, time and a counter).
    try:
        return int(msg_id, 16) % topic.queues
    except ValueError:  # a client-made id that is not hex: any stable spread will do
        return int(hashlib.sha256(msg_id.encode()).hexdigest()[:8], 16) % topic.queues


# The channel every message that becomes receivable is announced on; waiting consumers are woken
# from it (apps/broker/wakeups.py, docs/decisions/0024). The payload starts with the topic id.
RECEIVABLE_CHANNEL = "txhub_receivable"


def notify_receivable(*, topic_id: int, what: str) -> None:
    """Announces, at the commit of the caller's transaction, that something on the topic became
    receivable other than through a new offset (a dead letter sent back)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_notify(%s, concat_ws(' ', %s::bigint, %s::text))",
            [RECEIVABLE_CHANNEL, topic_id, what],
        )


# The one commit-log append (send, commit, delayed delivery): two clauses every appending
# statement is made of, here and in committing.py, composed of constants only; every value is
# bound by the server.
#
# take_offsets: `n` offsets of one queue (the queue row `q` that `where` names, joined `from_`
# another row if it needs one), handed out by an UPDATE that keeps the queue row locked until
# the caller's transaction commits. Lock: without it two concurrent commits could make offset
# N+1 visible before N, and a consumer that has read N+1 would skip N for ever (CONTRACT
# invariant 5). Every message becomes receivable here, so this is also where it is announced:
# the NOTIFY is part of the transaction, delivered to listeners when (and only if) it commits,
# with no extra round trip; its payload, "topic queue first_offset n", is one per append
# (Postgres does not fold them) and says how many arrived.
GIVEN_QUEUE = "q.topic_id = %(topic_id)s AND q.queue_id = %(queue_id)s"


def take_offsets(*, where: str = GIVEN_QUEUE, n: str = "%(n)s", from_: str = "") -> str:
    return f"""
    UPDATE broker_messagequeue q SET next_offset = q.next_offset + {n}{from_}
    WHERE {where}
    RETURNING q.next_offset - {n} AS first_offset,
        pg_notify('{RECEIVABLE_CHANNEL}',
            concat_ws(' ', q.topic_id, q.queue_id, q.next_offset - {n}, {n}))
    """  # noqa: S608 - composed of constants only


# append_entries: the commit-log rows of `messages`, a FROM item `m` with the columns msg_id,
# queue_id, tags, keys, properties, body, body_is_binary, born_at, producer_group,
# transaction_id, topic_id, message_group and i (1, 2, ...), stored at %(now)s in the queue of
# the `queue` CTE (a take_offsets) from its first offset on, in the order of m.i.
def append_entries(*, messages: str, returning: str) -> str:
    return f"""
    INSERT INTO broker_commitlogentry (msg_id, queue_id, tags, keys, properties, body,
        body_is_binary, born_at, queue_offset, producer_group, transaction_id, stored_at, topic_id,
        message_group)
    SELECT m.msg_id, m.queue_id, m.tags, m.keys, m.properties, m.body, m.body_is_binary,
        m.born_at, queue.first_offset + m.i - 1, m.producer_group, m.transaction_id, %(now)s,
        m.topic_id, m.message_group
    FROM queue, {messages}
    ORDER BY m.i
    RETURNING {returning}
    """  # noqa: S608 - composed of constants only


# Messages given as arrays, appended to one queue in one statement, in the order given.
_GIVEN_MESSAGES = """(
    SELECT u.msg_id, %(queue_id)s::smallint AS queue_id, u.tags, u.keys::jsonb AS keys,
        u.properties::jsonb AS properties, u.body, u.body_is_binary, u.born_at,
        u.producer_group, u.transaction_id, %(topic_id)s::bigint AS topic_id, u.message_group,
        u.i
    FROM unnest(%(msg_ids)s::varchar[], %(tags)s::varchar[], %(keys)s::text[],
        %(properties)s::text[], %(bodies)s::bytea[], %(binary)s::bool[],
        %(born)s::timestamptz[], %(groups)s::varchar[], %(transactions)s::uuid[],
        %(message_groups)s::varchar[])
        WITH ORDINALITY AS u(msg_id, tags, keys, properties, body, body_is_binary, born_at,
            producer_group, transaction_id, message_group, i)
) m"""
APPEND_SQL = f"""
WITH queue AS ({take_offsets()})
{append_entries(messages=_GIVEN_MESSAGES, returning="msg_id, queue_offset")}
"""
# The same, for client-chosen ids: claimed before the queue row is taken (client_ids.claim_sql).
_CLAIM = claim_sql("VARIADIC %(msg_ids)s::varchar[]")
CLAIMED_APPEND_SQL = f"""
WITH {_CLAIM["claim"]}queue AS ({take_offsets(where=f"{GIVEN_QUEUE} AND {_CLAIM['claimed']}")})
{append_entries(messages=_GIVEN_MESSAGES, returning="msg_id, queue_offset")}
"""


@dataclass(frozen=True)
class Appended:
    """A message to append: its id and content, and when it was born (a delayed message moved
    on keeps its birth and its transaction)."""

    msg_id: str
    message: OutgoingMessage
    born_at: datetime
    transaction_id: uuid.UUID | None = None


def commit_log_append(
    *, topic_id: int, queue_id: int, entries: list[Appended], now: datetime, claim: bool = False
) -> list[int]:
    """The queue offsets of `entries`, appended to one queue in this order, stored at `now`.
    Inside a caller's transaction, the queue row stays locked until it commits. `claim`: their
    ids are client-chosen, claimed by the same statement (IntegrityError when one is held)."""
    with connection.cursor() as cursor:
        cursor.execute(
            CLAIMED_APPEND_SQL if claim else APPEND_SQL,
            {
                "n": len(entries),
                "topic_id": topic_id,
                "queue_id": queue_id,
                "now": now,
                "msg_ids": [e.msg_id for e in entries],
                "tags": [e.message.tags for e in entries],
                "keys": [json.dumps(e.message.keys) for e in entries],
                "properties": [json.dumps(e.message.properties) for e in entries],
                "bodies": [e.message.body for e in entries],
                "binary": [e.message.body_is_binary for e in entries],
                "born": [e.born_at for e in entries],
                "groups": [e.message.producer_group for e in entries],
                "transactions": [e.transaction_id for e in entries],
                "message_groups": [e.message.message_group for e in entries],
            },
        )
        offsets = dict(cursor.fetchall())
    assert len(offsets) == len(entries), "every topic has a counter row per queue"  # noqa: S101
    return [offsets[e.msg_id] for e in entries]


@dataclass(frozen=True)
class Sent:
    msg_id: str
    topic: Topic
    queue_id: int
    queue_offset: int | None  # None while the message waits for its delivery time
    deliver_at: datetime
    message_group: str = ""


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
    for attempt in range(4):
        # First as it is: a fresh id (a client's every first send) is stored by one statement,
        # whose claim refuses it if anything holds it (decision 0074). Then, or for a held id,
        # as decision 0040 says: the earlier answer, or this group's scoped id.
        if attempt and held(msg_id):
            stored_id = stored_id_for(client_id=msg_id, producer_group=message.producer_group)
            earlier = message_by_client_id(msg_id=stored_id, topic=topic, message=message)
            if earlier is not None:
                return earlier
        else:
            stored_id = msg_id
        if failpoints.ARMED:
            failpoints.hit("after_msg_id_check")
        try:
            [sent] = message_send_batch(
                topic=topic, messages=[(message, deliver_at)], msg_ids=[stored_id]
            )
            return sent
        except IntegrityError:
            # The id is held after all (the claim, client_ids.claim_sql): a concurrent retry
            # stored it first, answer what it stored; or another group took it meanwhile, this
            # group's message takes its scoped id.
            continue
    raise Conflict(f"Message id {msg_id} is in use.")


def message_by_client_id(*, msg_id: str, topic: Topic, message: OutgoingMessage) -> Sent | None:
    """The message a producer already stored under its own id, or None. The same id used for
    another of the group's topics, by one of its transactions or by a message it recalled
    (decision 0075), is a conflict; another group's message under it (a race with
    `stored_id_for`) is a conflict that says nothing about it."""

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
        return Sent(
            msg_id, topic, entry.queue_id, entry.queue_offset, entry.stored_at, entry.message_group
        )
    delayed = DelayedMessage.objects.filter(msg_id=msg_id).first()
    if delayed is not None:
        owned(delayed)
        return Sent(
            msg_id, topic, delayed.queue_id, None, delayed.deliver_at, delayed.message_group
        )
    half = HalfMessage.objects.filter(msg_id=msg_id)
    if half.filter(producer_group__name=message.producer_group).exists():
        raise Conflict(f"Message id {msg_id} is in use by a transaction.")
    if half.exists():
        raise Conflict(f"Message id {msg_id} is in use.")
    refuse_recalled(msg_id=msg_id, producer_group=message.producer_group)
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
    # A group at or over its storage quota stores nothing more (decision 0085), at every door.
    for group in {message.producer_group for message, _ in messages}:
        check_storage_quota(group)
    # Ids the caller gives are client-chosen (or scoped from one) and must be claimed; ours are
    # random (128 bits) and need no claim (client_ids.claim_sql).
    claimed = msg_ids is not None
    msg_ids = msg_ids or [new_msg_id() for _ in messages]
    queues = [
        queue_for(topic=topic, msg_id=msg_id, message_group=message.message_group)
        for msg_id, (message, _) in zip(msg_ids, messages, strict=True)
    ]
    now = timezone.now()
    sent: list[Sent | None] = [None] * len(messages)
    visible: dict[int, list[int]] = {}  # queue -> indexes of the batch, in batch order
    for i in range(len(messages)):
        if messages[i][1] is None:
            visible.setdefault(queues[i], []).append(i)
    # One statement, and so one transaction, when nothing is delayed and one queue is touched.
    # (Inside a caller's transaction, a savepoint all the same: a duplicate msg_id, answered by
    # message_send's retry, must not abort the caller's transaction.)
    single = len(visible) == 1 and sum(map(len, visible.values())) == len(messages)
    alone = single and not connection.in_atomic_block
    with contextlib.nullcontext() if alone else transaction.atomic():
        if claimed and not alone:  # alone, the append's own statement claims them
            claim_ids(msg_ids)
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
                sent[i] = Sent(
                    msg_ids[i], topic, queues[i], None, deliver_at, message.message_group
                )
        for queue_id in sorted(visible):
            indexes = visible[queue_id]
            offsets = commit_log_append(
                topic_id=topic.pk,
                queue_id=queue_id,
                entries=[Appended(msg_ids[i], messages[i][0], now) for i in indexes],
                now=now,
                claim=claimed and alone,
            )
            for i, offset in zip(indexes, offsets, strict=True):
                group = messages[i][0].message_group
                sent[i] = Sent(msg_ids[i], topic, queue_id, offset, now, group)
    if failpoints.ARMED:
        failpoints.hit_after_commit("after_send_before_answer")
    return [item for item in sent if item is not None]
