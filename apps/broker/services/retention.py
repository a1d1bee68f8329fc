"""Retention (docs/decisions/0080): what is older than its retention and finished is deleted, in
batches, each in a short transaction of its own, until nothing is left or the run's time is up
(the rest waits for the next run). Postgres' clock decides what is old (decision 0020).

- A dead-letter entry: TXHUB_DLQ_RETENTION after it was dead-lettered.
- A commit-log row (with its deliveries): older than TXHUB_RETENTION and finished for every
  consumer group with a cursor on its queue: each such cursor is past it, and no group holds it
  in flight, held behind its message group (FIFO) or in its dead-letter queue. A group with no
  cursor on the queue (it never received from the topic) holds nothing.
- A resolved half message (with its op records): resolved before TXHUB_RETENTION, its delayed
  message (if any) no longer waiting, and its commit-log row (if any) older than the retention
  too: the nightly reconciliation of the row's day reads the half (spark_jobs/recheck.py).
- A recalled message: TXHUB_RETENTION after its recall.
"""

import time
from datetime import datetime, timedelta
from itertools import takewhile
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from apps.broker.clock import db_now
from apps.broker.models import ConsumerGroup
from apps.broker.services import storage_usage

# The advisory lock (this class, a topic id) between a group's first receive from a topic, which
# makes its cursors (from offset 0 for consume_from "first") and reads from them in one
# transaction, and the sweep's deletion of that topic's rows, which a new cursor may hold.
NEW_CURSORS_LOCK = 0x7478_7274  # "txrt"

# A delivery that keeps its message: in flight (or waiting for its redelivery), held behind its
# message group (FIFO), or dead-lettered and not yet past the dead-letter retention. A LATERAL
# with LIMIT 1: one probe of delivery_unique per row, never a hash of the whole table.
_HOLDING_JOIN = """
LEFT JOIN LATERAL (
    SELECT true AS held FROM broker_delivery d
    WHERE d.message_id = e."offset" AND d.state IN ('INFLIGHT', 'HELD', 'DLQ') LIMIT 1
) holding ON true
"""

# The ids the inner SELECT locks, as an array (an InitPlan evaluated once): the DELETE probes
# the primary key with them rather than joining the whole table.
_DEAD_LETTERS_SQL = """
DELETE FROM broker_delivery WHERE id = ANY(ARRAY(
    SELECT id FROM broker_delivery
    WHERE group_id = %(group)s AND state = 'DLQ' AND dlq_at < %(cutoff)s
    ORDER BY dlq_at LIMIT %(batch)s FOR UPDATE SKIP LOCKED
))
"""

_RECALLED_SQL = f"""
DELETE FROM broker_recalledmessage m WHERE id = ANY(ARRAY(
    SELECT id FROM broker_recalledmessage WHERE recalled_at < %(cutoff)s
    ORDER BY recalled_at LIMIT %(batch)s FOR UPDATE SKIP LOCKED
)) RETURNING {storage_usage.returning(storage_usage.RECALLED, "m")}
"""  # noqa: S608 - composed of constants only

# Each queue, and the lowest next offset of the groups' cursors on it: the rows below it are
# past every cursor (a queue no group has a cursor on: all of them).
_QUEUES_SQL = """
SELECT q.topic_id, q.queue_id, coalesce(min(c.next_offset), q.next_offset)
FROM broker_messagequeue q
LEFT JOIN broker_consumercursor c ON c.topic_id = q.topic_id AND c.queue_id = q.queue_id
GROUP BY q.id ORDER BY q.topic_id, q.queue_id
"""

# One page of a queue below its cursors, in offset order (commit_log_position_unique): each
# row's offset, its queue offset, whether it is old enough, and whether a delivery holds it.
_ENTRIES_PAGE_SQL = f"""
SELECT e."offset", e.queue_offset, e.stored_at < %(cutoff)s, holding.held IS NOT NULL
FROM broker_commitlogentry e {_HOLDING_JOIN}
WHERE e.topic_id = %(topic)s AND e.queue_id = %(queue)s
    AND e.queue_offset >= %(after)s AND e.queue_offset < %(below)s
ORDER BY e.queue_offset LIMIT %(batch)s
"""  # noqa: S608 - composed of constants only

# The rule checked again under the rows' locks (a row some transaction has locked is left for
# the next run), the topic's new cursors being committed by then (NEW_CURSORS_LOCK).
_DOOMED_ENTRIES_SQL = f"""
SELECT e."offset" FROM broker_commitlogentry e {_HOLDING_JOIN}
WHERE e."offset" = ANY(%(offsets)s::bigint[]) AND e.stored_at < %(cutoff)s
    AND holding.held IS NULL
    AND NOT EXISTS (
        SELECT 1 FROM broker_consumercursor c
        WHERE c.topic_id = e.topic_id AND c.queue_id = e.queue_id
            AND c.next_offset <= e.queue_offset
    )
FOR UPDATE OF e SKIP LOCKED
"""  # noqa: S608 - composed of constants only

# One page of resolved halves by resolution time (half_resolved_idx), after the last one seen:
# each one's id, its resolution time (as text: never read into Python, see scans.py), and
# whether its message is still on its way to the log or in it for less than the retention.
# Scalar subqueries (each table has at most one row of a transaction): one probe of its unique
# index per half, where an EXISTS could be planned as a hash of every young row of the log.
_HALVES_PAGE_SQL = """
SELECT h.id, h.resolved_at::text,
    (SELECT true FROM broker_delayedmessage m WHERE m.transaction_id = h.transaction_id)
        IS NOT NULL
    OR coalesce((
        SELECT l.stored_at >= %(cutoff)s FROM broker_commitlogentry l
        WHERE l.transaction_id = h.transaction_id
    ), false)
FROM broker_halfmessage h
WHERE h.resolved_at < %(cutoff)s AND h.state IN ('COMMITTED', 'ROLLED_BACK')
    AND h.resolved_at >= %(after_at)s::timestamptz
    AND (h.resolved_at, h.id) > (%(after_at)s::timestamptz, %(after_id)s)
ORDER BY h.resolved_at, h.id LIMIT %(batch)s
"""

# The deletions, returning what the storage measure takes off their groups (decision 0085).
_DELETE_ENTRIES_SQL = f"""
DELETE FROM broker_commitlogentry e WHERE e."offset" = ANY(%s::bigint[])
RETURNING {storage_usage.returning(storage_usage.COMMIT_LOG, "e")}
"""  # noqa: S608 - composed of constants only
_DELETE_HALVES_SQL = f"""
DELETE FROM broker_halfmessage h USING broker_producergroup g
WHERE h.id = ANY(%s::bigint[]) AND g.id = h.producer_group_id
RETURNING {storage_usage.returning(storage_usage.HALF_MESSAGES, "h")}
"""  # noqa: S608 - composed of constants only

_DOOMED_HALVES_SQL = (
    "SELECT id FROM broker_halfmessage WHERE id = ANY(%s::bigint[]) FOR UPDATE SKIP LOCKED"
)


class _Clock:
    """The run's time budget: a run that cannot finish leaves the rest to the next one."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def up(self) -> bool:
        return time.monotonic() >= self.deadline


def retention_sweep(*, batch: int = 1000, seconds: float | None = None) -> dict[str, int]:
    """Deletes what is past its retention and finished, `batch` rows of a table at a time, for at
    most `seconds` (None: half the sweep's beat period, so a run ends before the next starts);
    returns how many rows of each kind went."""
    if seconds is None:
        seconds = settings.CELERY_BEAT_SCHEDULE["retention"]["schedule"].total_seconds() / 2
    clock = _Clock(seconds)
    now = db_now()
    cutoff = now - timedelta(seconds=settings.TXHUB_RETENTION)
    # Dead-letter entries first: one past its own retention no longer holds its log row.
    dead_letters = _sweep_dead_letters(
        now - timedelta(seconds=settings.TXHUB_DLQ_RETENTION), batch, clock
    )
    commit_log = _sweep_commit_log(cutoff, batch, clock)
    return {
        "dead_letters": dead_letters,
        "commit_log": commit_log,
        "half_messages": _sweep_halves(cutoff, batch, clock),
        "recalled": _drain(
            _RECALLED_SQL, {"cutoff": cutoff, "batch": batch}, batch, clock, storage_usage.RECALLED
        ),
    }


def hold_for_new_cursors(*, topic_id: int) -> None:
    """Called by a group's first receive from a topic, in its transaction, before it makes its
    cursors: the sweep deletes none of the topic's rows until that transaction ends, and checks
    the new cursors when it does. Waits at most for one sweep's deletion of one page. A group's
    deletion holds it too, for each topic it read (registry.consumer_group_delete)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock_shared(%s, %s::int)", [NEW_CURSORS_LOCK, topic_id]
        )


def _drain(
    sql: str,
    params: dict[str, Any],
    batch: int,
    clock: _Clock,
    measured: storage_usage.Table | None = None,
) -> int:
    """Runs a deleting statement of at most `batch` rows until it deletes fewer; `measured`: the
    table of messages it deletes from, whose rows it returns for the storage measure."""
    total = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            if measured is not None:
                storage_usage.hold_measure(measured)  # before the rows' locks: decision 0089
            cursor.execute(sql, params)
            deleted = int(cursor.rowcount)
            if measured is not None:
                storage_usage.forget_rows(measured, cursor.fetchall())
        total += deleted
        if deleted < batch or clock.up():
            return total


def _sweep_dead_letters(cutoff: datetime, batch: int, clock: _Clock) -> int:
    # Group by group: the dead-letter index (delivery_dlq_idx) is led by the group.
    total = 0
    for group_id in ConsumerGroup.objects.order_by("pk").values_list("pk", flat=True):
        params = {"group": group_id, "cutoff": cutoff, "batch": batch}
        total += _drain(_DEAD_LETTERS_SQL, params, batch, clock)
        if clock.up():
            break
    return total


def _sweep_commit_log(cutoff: datetime, batch: int, clock: _Clock) -> int:
    with connection.cursor() as cursor:
        cursor.execute(_QUEUES_SQL)
        queues = cursor.fetchall()
    total = 0
    busy: set[int] = set()  # topics whose first receive is under way: left for the next run
    for topic_id, queue_id, below in queues:
        if topic_id in busy:
            continue
        deleted = _sweep_queue(topic_id, queue_id, below, cutoff, batch, clock)
        if deleted is None:
            busy.add(topic_id)
        else:
            total += deleted
        if clock.up():
            break
    return total


def _sweep_queue(
    topic_id: int, queue_id: int, below: int, cutoff: datetime, batch: int, clock: _Clock
) -> int | None:
    """Deletes the queue's finished old rows below offset `below`, walking up from its first row
    to its first one younger than the retention; None: the topic is busy (a first receive)."""
    total = 0
    after = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                _ENTRIES_PAGE_SQL,
                {
                    "topic": topic_id,
                    "queue": queue_id,
                    "after": after,
                    "below": below,
                    "cutoff": cutoff,
                    "batch": batch,
                },
            )
            page = cursor.fetchall()
        # Rows are stored in offset order: from the first young one on, all are young.
        old = list(takewhile(lambda row: row[2], page))
        doomed = [row[0] for row in old if not row[3]]
        if doomed:
            deleted = _delete_entries(topic_id, doomed, cutoff)
            if deleted is None:
                return None
            total += deleted
        if len(old) < batch or clock.up():
            return total
        after = page[-1][1] + 1


def _delete_entries(topic_id: int, offsets: list[int], cutoff: datetime) -> int | None:
    with transaction.atomic(), connection.cursor() as cursor:
        # Lock (the measure's, decision 0089): a measure of the log under way is waited for
        # here, before the topic's lock below, which a first receive from the topic waits for.
        storage_usage.hold_measure(storage_usage.COMMIT_LOG)
        # Lock (advisory, to the end of this transaction; not waiting): a first receive from the
        # topic that is making its cursors holds it shared until it commits them.
        cursor.execute(
            "SELECT pg_try_advisory_xact_lock(%s, %s::int)", [NEW_CURSORS_LOCK, topic_id]
        )
        [(locked,)] = cursor.fetchall()
        if not locked:
            return None
        cursor.execute(_DOOMED_ENTRIES_SQL, {"offsets": offsets, "cutoff": cutoff})
        doomed = [row[0] for row in cursor.fetchall()]
        # By the arrays: index probes (delivery_unique, the primary key), never a join.
        cursor.execute("DELETE FROM broker_delivery WHERE message_id = ANY(%s::bigint[])", [doomed])
        cursor.execute(_DELETE_ENTRIES_SQL, [doomed])
        gone = cursor.fetchall()
        storage_usage.forget_rows(storage_usage.COMMIT_LOG, gone)
        return len(gone)


def _sweep_halves(cutoff: datetime, batch: int, clock: _Clock) -> int:
    total = 0
    after_at, after_id = "-infinity", 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                _HALVES_PAGE_SQL,
                {"cutoff": cutoff, "after_at": after_at, "after_id": after_id, "batch": batch},
            )
            page = cursor.fetchall()
        doomed = [row[0] for row in page if not row[2]]
        if doomed:
            total += _delete_halves(doomed)
        if len(page) < batch or clock.up():
            return total
        after_id, after_at = page[-1][0], page[-1][1]


def _delete_halves(ids: list[int]) -> int:
    with transaction.atomic(), connection.cursor() as cursor:
        storage_usage.hold_measure(storage_usage.HALF_MESSAGES)  # first: decision 0089
        cursor.execute(_DOOMED_HALVES_SQL, [ids])
        doomed = [row[0] for row in cursor.fetchall()]
        cursor.execute("DELETE FROM broker_oprecord WHERE half_id = ANY(%s::bigint[])", [doomed])
        cursor.execute(_DELETE_HALVES_SQL, [doomed])
        gone = cursor.fetchall()
        storage_usage.forget_rows(storage_usage.HALF_MESSAGES, gone)
        return len(gone)
