"""What each producer group keeps stored, measured by a beat task (docs/decisions/0085), and the
groups at or over TXHUB_PRODUCER_GROUP_STORAGE_QUOTA published for every door's check
(apps/broker/storage_quota.py).

A message's bytes are its body's, its tag's and its keys' and properties' as stored (the jsonb
columns' size), in every table that keeps a copy for its group: half messages whatever their
state (a resolved one stays until retention removes it), delayed messages, the commit log, and
recalled messages. A committed transactional message counts twice (its half and its log row),
as it takes the room twice.

Each table is read by id, incrementally, never whole: rows up to its `counted_to` are added up
for good (StoredBytes.counted), and the statements that delete rows (retention, the delayed
delivery, a recall) take theirs off in the same transaction (`forget_rows`). Rows above it are
added up anew at each measure (StoredBytes.recent). A measure moves `counted_to` to the top id
an earlier measure saw only once every transaction that was running then has ended
(docs/decisions/0095): a row whose transaction commits late, however late, is in `recent` until
it is counted for good, never missed and never counted twice. The send and prepare statements
are not touched.
"""

import logging
from typing import Any

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.backends.utils import CursorWrapper
from psycopg import errors

from apps.broker import storage_quota

logger = logging.getLogger(__name__)

# The advisory lock (this class, hashtext of a table's name) a measure of the table takes alone
# and every transaction deleting its rows takes shared (docs/decisions/0089, 0095). Advisory
# locks queue: a measure waiting for deletions under way is not passed by the next ones, as it
# is by row locks taken FOR SHARE, so steady deletions cannot keep it away.
MEASURE_LOCK = 0x7478_736D  # "txsm"

# One SQL expression, every reader's: a row's stored bytes. octet_length of a bytea and
# pg_column_size read the stored value's header, never its TOASTed content.
SIZE_SQL = (
    "octet_length({t}.body) + octet_length({t}.tags) + pg_column_size({t}.keys) "
    "+ pg_column_size({t}.properties)"
)


class Table:
    """A table that keeps messages: its name, the row's id column, and its group's name (an SQL
    expression of the row, `{t}`, and of what `joins` joins to it)."""

    def __init__(self, name: str, id_column: str, group: str, joins: str = "") -> None:
        self.name, self.id_column, self.group, self.joins = name, id_column, group, joins

    def sums_sql(self) -> str:
        """Bytes per group of the rows with an id in (%(low)s, %(high)s]."""
        group, size = self.group.format(t="r"), SIZE_SQL.format(t="r")
        return (
            f"SELECT {group} AS grp, sum({size})::bigint AS bytes FROM {self.name} r {self.joins} "  # noqa: S608
            f"WHERE r.{self.id_column} > %(low)s AND r.{self.id_column} <= %(high)s GROUP BY 1"
        )


COMMIT_LOG = Table("broker_commitlogentry", '"offset"', "{t}.producer_group")
HALF_MESSAGES = Table(
    "broker_halfmessage",
    "id",
    "g.name",
    "JOIN broker_producergroup g ON g.id = r.producer_group_id",
)
DELAYED = Table("broker_delayedmessage", "id", "{t}.producer_group")
RECALLED = Table("broker_recalledmessage", "id", "{t}.producer_group")
TABLES = (COMMIT_LOG, HALF_MESSAGES, DELAYED, RECALLED)

_COUNTED_SQL = """
INSERT INTO broker_storedbytes (producer_group, stored_table, counted, recent)
SELECT s.grp, %(table)s, s.bytes, 0 FROM ({sums}) s
ON CONFLICT (producer_group, stored_table)
DO UPDATE SET counted = broker_storedbytes.counted + EXCLUDED.counted
"""
_RECENT_SQL = """
INSERT INTO broker_storedbytes (producer_group, stored_table, counted, recent)
SELECT s.grp, %(table)s, 0, s.bytes FROM ({sums}) s
ON CONFLICT (producer_group, stored_table) DO UPDATE SET recent = EXCLUDED.recent
"""

# Rows a statement deleted (their groups, ids and bytes), taken off what was counted of them.
# The deleting transaction holds MEASURE_LOCK shared (hold_measure) to its end: a measure under
# way holds it alone to its commit, so rows it is adding up now are taken off with its new
# `counted_to`, and rows it will not see (deleted first) are taken off with the old one.
_FORGET_SQL = """
WITH measure AS (
    SELECT counted_to FROM broker_storagemeasure WHERE stored_table = %(table)s
), gone AS (
    SELECT u.grp, sum(u.bytes)::bigint AS bytes
    FROM unnest(%(groups)s::varchar[], %(ids)s::bigint[], %(sizes)s::bigint[]) u(grp, id, bytes),
        measure
    WHERE u.id <= measure.counted_to GROUP BY u.grp
)
UPDATE broker_storedbytes s SET counted = s.counted - gone.bytes FROM gone
WHERE s.stored_table = %(table)s AND s.producer_group = gone.grp
"""


_HOLD_MEASURE_SQL = "SELECT pg_advisory_xact_lock_shared(%s, hashtext(%s))"


def hold_measure(table: Table) -> None:
    """Call first in a transaction that will delete rows of `table` (then `forget_rows`), before
    it takes any other lock or id: it waits here for a measure of the table under way, holding
    nothing. Waiting later, it held what it had taken meanwhile (the queues' rows a delayed
    delivery appends to, which every send to them needs; a topic's retention lock, which a first
    receive needs) and the ids it had inserted, which then committed too late to be counted and
    were taken off when deleted (docs/decisions/0089)."""
    with connection.cursor() as cursor:
        cursor.execute(_HOLD_MEASURE_SQL, [MEASURE_LOCK, table.name])


def forget_rows(table: Table, rows: list[tuple[str, int, int]]) -> None:
    """Called in the transaction that deleted `rows` (group, id, bytes) of `table`."""
    if not rows:
        return
    groups, ids, sizes = (list(column) for column in zip(*rows, strict=True))
    hold_measure(table)  # held already by every caller; taken again, it is theirs to the end
    with connection.cursor() as cursor:
        cursor.execute(
            _FORGET_SQL, {"table": table.name, "groups": groups, "ids": ids, "sizes": sizes}
        )


def returning(table: Table, alias: str) -> str:
    """A deleting statement's RETURNING list for `forget_rows` (the group as `table` names it
    with the deleted row as `alias`; a half message's deletion joins its group as `g`)."""
    group = table.group.format(t=alias)
    return f"{group}, {alias}.{table.id_column}, {SIZE_SQL.format(t=alias)}"


_DELETE_DELAYED_SQL = f"""
DELETE FROM broker_delayedmessage d WHERE d.id = ANY(%s::bigint[])
RETURNING {returning(DELAYED, "d")}
"""  # noqa: S608 - composed of constants only


def delayed_delete(ids: list[int]) -> None:
    """Deletes delayed messages (delivered, or recalled), in the caller's transaction."""
    if not ids:
        return
    with connection.cursor() as cursor:
        cursor.execute(_DELETE_DELAYED_SQL, [ids])
        forget_rows(DELAYED, cursor.fetchall())


def storage_measure() -> dict[str, int]:
    """Measures every table (each in a transaction of its own, waiting up to one measuring
    period for the deletions under way and for another measure of it) and publishes the groups
    at or over their quota. Returns them, with the bytes each keeps."""
    period = settings.CELERY_BEAT_SCHEDULE["storage-measure"]["schedule"].total_seconds()
    for table in TABLES:
        _measure(table, wait_seconds=period)
    over = groups_over_quota()
    storage_quota.publish(over, seconds=max(60.0, 6 * period))
    return over


# The top id of a table and, in the same snapshot, the oldest transaction still running and the
# first not yet begun (as bigint: an xid8 stays far below 2**63).
_TOP_SQL = """
SELECT (SELECT coalesce(max({id}), 0) FROM {table}),
    pg_snapshot_xmin(pg_current_snapshot())::text::bigint,
    pg_snapshot_xmax(pg_current_snapshot())::text::bigint
"""


def _measure(table: Table, wait_seconds: float) -> None:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO broker_storagemeasure (stored_table, counted_to, seen_to, "
                "seen_horizon, pending_to, measured_at) VALUES (%s, 0, 0, 0, 0, now()) "
                "ON CONFLICT (stored_table) DO NOTHING",
                [table.name],
            )
            # Lock (MEASURE_LOCK alone, to the commit): measures of two beats would add the same
            # rows twice; deletions wait (see _FORGET_SQL). Bounded: past it, the next beat.
            cursor.execute(
                "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)",
                [f"{wait_seconds}s"],
            )
            [(lock_timeout, _)] = cursor.fetchall()
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [MEASURE_LOCK, table.name]
            )
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [lock_timeout])
            _measure_held(cursor, table)
    except OperationalError as error:
        if not isinstance(error.__cause__, errors.LockNotAvailable):
            raise
        logger.warning("storage measure of %s left to the next beat: lock wait", table.name)


def _measure_held(cursor: CursorWrapper, table: Table) -> None:
    cursor.execute(
        "SELECT counted_to, seen_to, seen_horizon, pending_to FROM broker_storagemeasure "
        "WHERE stored_table = %s FOR UPDATE",
        [table.name],
    )
    counted_to, seen_to, seen_horizon, pending_to = cursor.fetchone()
    cursor.execute(_TOP_SQL.format(id=table.id_column, table=table.name))
    [(top, oldest_running, first_unbegun)] = cursor.fetchall()
    # Rule (docs/decisions/0095): ids up to seen_to were taken by transactions that had begun
    # before seen_horizon; once none of those runs, every row up to seen_to that will ever be
    # there is visible now, and counted_to moves there. Until then it stays. An id read as
    # top becomes seen_to one promotion later, with that later snapshot's horizon: a
    # transaction that had taken an id but had no xid yet (between the two in one INSERT) has
    # one by then.
    if oldest_running >= seen_horizon:
        params: dict[str, Any] = {"table": table.name, "low": counted_to, "high": seen_to}
        cursor.execute(_COUNTED_SQL.format(sums=table.sums_sql()), params)
        counted_to, seen_to = seen_to, max(pending_to, seen_to)
        pending_to, seen_horizon = max(top, seen_to), first_unbegun
    cursor.execute(
        "UPDATE broker_storedbytes SET recent = 0 WHERE stored_table = %s AND recent <> 0",
        [table.name],
    )
    params = {"table": table.name, "low": counted_to, "high": max(top, pending_to, seen_to)}
    cursor.execute(_RECENT_SQL.format(sums=table.sums_sql()), params)
    cursor.execute(
        "UPDATE broker_storagemeasure SET counted_to = %s, seen_to = %s, seen_horizon = %s, "
        "pending_to = %s, measured_at = now() WHERE stored_table = %s",
        [counted_to, seen_to, seen_horizon, pending_to, table.name],
    )


def stored_bytes() -> dict[str, int]:
    """The bytes each producer group keeps, as last measured (groups that keep none: absent)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT producer_group, sum(counted + recent)::bigint FROM broker_storedbytes "
            "GROUP BY producer_group HAVING sum(counted + recent) > 0 ORDER BY producer_group"
        )
        return {group: int(total) for group, total in cursor.fetchall()}


def groups_over_quota() -> dict[str, int]:
    quota: int = settings.TXHUB_PRODUCER_GROUP_STORAGE_QUOTA
    if quota <= 0:
        return {}
    return {group: kept for group, kept in stored_bytes().items() if kept >= quota}
