"""Set-based seeding of many transactions for the benchmarks (console pages, reconciliation) and
of pending ones for the check-back scan (its bench and tests/broker/test_checkback.py).

Writes what the services would write, in a few INSERT ... SELECT statements: half messages in a
realistic mix of states, their op records (PREPARE, CHECK for some, then the final op or PARK)
and a commit-log row for each committed one, with dense queue offsets. Everything goes into the
given producer group and topic so that `unseed` can remove it again.
"""

from typing import Any

from django.db import connection

# Of every 100 transactions: 85 committed, 10 rolled back, 4 pending, 1 parked. Every 7th
# resolution is made by check-back, every 50th by an operator.
HALVES = """
INSERT INTO broker_halfmessage (msg_id, queue_id, tags, keys, properties, body, body_is_binary,
    born_at, transaction_id, state, check_times, unreachable_checks, resolved_by, resolved_at,
    producer_group_id, topic_id, next_check_at, delay_seconds)
SELECT upper(md5(%(tag)s || g::text)), 0, '', jsonb_build_array('order-' || g), '{}'::jsonb,
    convert_to('{"order": ' || g || '}', 'UTF8'), false,
    %(start)s + g * %(spacing)s, gen_random_uuid(), s.state,
    CASE WHEN g %% 7 = 0 THEN 1 ELSE 0 END, 0,
    CASE WHEN s.state IN ('PREPARED', 'PARKED') THEN ''
         WHEN g %% 50 = 0 THEN 'OPERATOR' WHEN g %% 7 = 0 THEN 'CHECK_BACK' ELSE 'PRODUCER' END,
    CASE WHEN s.state IN ('COMMITTED', 'ROLLED_BACK')
         THEN %(start)s + g * %(spacing)s + interval '40 milliseconds' END,
    %(group)s, %(topic)s,
    CASE WHEN s.state = 'PREPARED' THEN now() + interval '1 hour' END, NULL
FROM generate_series(1, %(count)s) AS g,
LATERAL (SELECT CASE WHEN g %% 100 < 85 THEN 'COMMITTED' WHEN g %% 100 < 95 THEN 'ROLLED_BACK'
                     WHEN g %% 100 < 99 THEN 'PREPARED' ELSE 'PARKED' END AS state) s
"""
OPS = """
INSERT INTO broker_oprecord (half_id, op, source, actor, reason, detail, at)
SELECT h.id, o.op, o.source, '', '', o.detail, o.at
FROM broker_halfmessage h,
LATERAL (VALUES
    ('PREPARE', 'PRODUCER', '{}'::jsonb, h.born_at),
    (CASE WHEN h.check_times > 0 THEN 'CHECK' END, 'CHECK_BACK',
        '{"answer": "UNKNOWN", "reached": true, "status": 200, "latency_ms": 3}'::jsonb,
        h.born_at + interval '20 milliseconds'),
    (CASE h.state WHEN 'COMMITTED' THEN 'COMMIT' WHEN 'ROLLED_BACK' THEN 'ROLLBACK'
        WHEN 'PARKED' THEN 'PARK' END,
     CASE WHEN h.state = 'PARKED' THEN 'SYSTEM' ELSE h.resolved_by END, '{}'::jsonb,
     COALESCE(h.resolved_at, h.born_at + interval '30 milliseconds'))
) AS o(op, source, detail, at)
WHERE h.producer_group_id = %(group)s AND o.op IS NOT NULL
"""
LOG = """
WITH base AS (SELECT next_offset FROM broker_messagequeue WHERE topic_id = %(topic)s
              AND queue_id = 0 FOR UPDATE),
committed AS (
    SELECT h.*, row_number() OVER (ORDER BY h.id) - 1 AS n FROM broker_halfmessage h
    WHERE h.producer_group_id = %(group)s AND h.state = 'COMMITTED'
),
inserted AS (
    INSERT INTO broker_commitlogentry (msg_id, queue_id, tags, keys, properties, body,
        body_is_binary, born_at, queue_offset, producer_group, transaction_id, stored_at, topic_id)
    SELECT c.msg_id, 0, c.tags, c.keys, c.properties, c.body, false, c.born_at,
        base.next_offset + c.n, %(group_name)s, c.transaction_id, c.resolved_at, c.topic_id
    FROM committed c, base
    RETURNING 1
)
UPDATE broker_messagequeue SET next_offset = next_offset + (SELECT count(*) FROM inserted)
WHERE topic_id = %(topic)s AND queue_id = 0
"""


def seed(
    *, count: int, group: Any, topic: Any, tag: str, start: Any, spacing_ms: float
) -> dict[str, int]:
    """Seeds `count` transactions born from `start` on, `spacing_ms` apart."""
    params = {
        "count": count,
        "group": group.pk,
        "group_name": group.name,
        "topic": topic.pk,
        "tag": tag,
        "start": start,
        "spacing": f"{spacing_ms} milliseconds",
    }
    with connection.cursor() as cursor:
        cursor.execute(HALVES.replace("%(spacing)s", "%(spacing)s::interval"), params)
        cursor.execute(OPS, params)
        ops = cursor.rowcount
        cursor.execute(LOG, params)
        cursor.execute("SELECT count(*) FROM broker_commitlogentry WHERE topic_id = %s", [topic.pk])
        log = cursor.fetchone()[0]
        cursor.execute("ANALYZE broker_halfmessage")
        cursor.execute("ANALYZE broker_oprecord")
        cursor.execute("ANALYZE broker_commitlogentry")
    return {"transactions": count, "op_records": ops, "commit_log": log}


# Pending transactions for the check-back scan: the first `due` were due a second ago, the others
# are due in an hour.
PENDING = """
INSERT INTO broker_halfmessage (msg_id, queue_id, tags, keys, properties, body, body_is_binary,
    born_at, transaction_id, state, check_times, unreachable_checks, resolved_by,
    producer_group_id, topic_id, next_check_at)
SELECT upper(md5(%(tag)s || g::text)), 0, '', '[]', '{}', 'x', false, now(), gen_random_uuid(),
    'PREPARED', 0, 0, '', %(group)s, %(topic)s,
    CASE WHEN g <= %(due)s THEN now() - interval '1 second' ELSE now() + interval '1 hour' END
FROM generate_series(1, %(pending)s) AS g
"""


def seed_pending(*, group: Any, topic: Any, pending: int, due: int, tag: str) -> None:
    """`pending` PREPARED transactions of the group, `due` of them due for a check now."""
    with connection.cursor() as cursor:
        cursor.execute(
            PENDING,
            {"tag": tag, "group": group.pk, "topic": topic.pk, "due": due, "pending": pending},
        )


def unseed(*, group: Any, topic: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM broker_oprecord WHERE half_id IN "
            "(SELECT id FROM broker_halfmessage WHERE producer_group_id = %s)",
            [group.pk],
        )
        cursor.execute("DELETE FROM broker_halfmessage WHERE producer_group_id = %s", [group.pk])
        cursor.execute("DELETE FROM broker_commitlogentry WHERE topic_id = %s", [topic.pk])
        cursor.execute("DELETE FROM broker_messagequeue WHERE topic_id = %s", [topic.pk])
        cursor.execute("DELETE FROM broker_topic WHERE id = %s", [topic.pk])
        cursor.execute("DELETE FROM broker_producergroup WHERE id = %s", [group.pk])
