"""The rows of a prepare: every half message of one (one or a batch of 64) and its PREPARE op,
written by one statement (transactions.transaction_prepare and transaction_prepare_batch)."""

import contextlib
import json
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from apps.broker.models import HalfMessage, OpKind, TransactionState
from apps.broker.services.client_ids import claim_sql, ids_args

# Every half message of a prepare (one or a batch of 64) and its PREPARE op, in one statement:
# one round trip, atomic without a transaction block of its own, and none of the ORM's per-row
# work (decision 0025). Composed of constants only.
# One row of PREPARE_SQL's VALUES per half message: scalar parameters, each typed here (arrays
# through unnest() would cost psycopg a type search per list and per request).
_PREPARED_ROW = (
    "(%s::varchar, %s::int, %s::varchar, %s::jsonb, %s::jsonb, %s::bytea, %s::bool, %s::uuid, "
    "%s::int, %s::timestamptz, %s::int, %s::timestamptz, %s::varchar)"
)

PREPARE_SQL = """
WITH m(msg_id, queue_id, tags, keys, properties, body, body_is_binary, transaction_id, immunity,
    next_check_at, delay_seconds, deliver_at, message_group) AS (VALUES {rows}),
{claim}half AS (
    INSERT INTO broker_halfmessage (msg_id, queue_id, tags, keys, properties, body,
        body_is_binary, born_at, transaction_id, producer_group_id, topic_id, state, check_times,
        check_immunity_seconds, next_check_at, checking_until, unreachable_checks, delay_seconds,
        deliver_at, resolved_at, resolved_by, message_group)
    SELECT m.msg_id, m.queue_id, m.tags, m.keys, m.properties, m.body, m.body_is_binary,
        %s::timestamptz, m.transaction_id, %s::bigint, %s::bigint, %s::varchar, 0, m.immunity,
        m.next_check_at, NULL, 0, m.delay_seconds, m.deliver_at, NULL, '', m.message_group
    FROM m WHERE {claimed}
    RETURNING id, msg_id
),
op AS (
    INSERT INTO broker_oprecord (half_id, op, source, actor, reason, detail, at)
    SELECT id, %s, %s, %s, '', '{{}}'::jsonb, %s::timestamptz FROM half
)
SELECT id, msg_id FROM half
"""


def insert_prepared(
    halves: list[HalfMessage], source: str, actor: str, now: datetime, claim: list[str]
) -> None:
    """Stores `halves` (of one group and topic) and their PREPARE ops, recorded as by `source`
    and `actor`; `claim`: the client-chosen ids among them, claimed by the statement
    (client_ids, decision 0074). Sets each half's primary key."""
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
            h.message_group,
        )
    params += [*claim, now, first.producer_group_id, first.topic_id, TransactionState.PREPARED]
    params += (OpKind.PREPARE, source, actor, now)
    # Inside a caller's transaction, a savepoint: a duplicate msg_id (IntegrityError, answered
    # by transactions.transaction_prepare's retry) must not abort the caller's transaction.
    nested = transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext()
    with nested, connection.cursor() as cursor:
        rows = ", ".join([_PREPARED_ROW] * len(halves))
        parts = claim_sql(ids_args(len(claim)) if claim else None)
        cursor.execute(PREPARE_SQL.format(rows=rows, **parts), params)
        ids = dict((msg_id, pk) for pk, msg_id in cursor.fetchall())
    for half in halves:
        half.pk = ids[half.msg_id]
        half._state.adding = False
