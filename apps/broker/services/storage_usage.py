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
added up anew at each measure (StoredBytes.recent) and for good one measure later, so a row
whose transaction commits within one measuring period of taking its id is counted; a row that
took longer is missed (never counted twice). The send and prepare statements are not touched.
"""

from typing import Any

from django.conf import settings
from django.db import connection, transaction

from apps.broker import storage_quota

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
# Lock (the table's measure row, shared, to the end of the deleting transaction): a measure
# under way holds it to its commit, so rows it is adding up now are taken off with its new
# `counted_to`, and rows it will not see (deleted first) are taken off with the old one.
_FORGET_SQL = """
WITH measure AS (
    SELECT counted_to FROM broker_storagemeasure WHERE stored_table = %(table)s FOR SHARE
), gone AS (
    SELECT u.grp, sum(u.bytes)::bigint AS bytes
    FROM unnest(%(groups)s::varchar[], %(ids)s::bigint[], %(sizes)s::bigint[]) u(grp, id, bytes),
        measure
    WHERE u.id <= measure.counted_to GROUP BY u.grp
)
UPDATE broker_storedbytes s SET counted = s.counted - gone.bytes FROM gone
WHERE s.stored_table = %(table)s AND s.producer_group = gone.grp
"""


_HOLD_MEASURE_SQL = "SELECT 1 FROM broker_storagemeasure WHERE stored_table = %s FOR SHARE"


def hold_measure(table: Table) -> None:
    """Call first in a transaction that will delete rows of `table` (then `forget_rows`), before
    it takes any other lock or id: it waits here for a measure of the table under way, holding
    nothing. Waiting later, it held what it had taken meanwhile (the queues' rows a delayed
    delivery appends to, which every send to them needs; a topic's retention lock, which a first
    receive needs) and the ids it had inserted, which then committed too late to be counted and
    were taken off when deleted (docs/decisions/0089)."""
    with connection.cursor() as cursor:
        cursor.execute(_HOLD_MEASURE_SQL, [table.name])


def forget_rows(table: Table, rows: list[tuple[str, int, int]]) -> None:
    """Called in the transaction that deleted `rows` (group, id, bytes) of `table`."""
    if not rows:
        return
    groups, ids, sizes = (list(column) for column in zip(*rows, strict=True))
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
    """Measures every table (each in a transaction of its own; a table another measure is
    reading is left to it) and publishes the groups at or over their quota. Returns them, with
    the bytes each keeps."""
    for table in TABLES:
        _measure(table)
    over = groups_over_quota()
    period = settings.CELERY_BEAT_SCHEDULE["storage-measure"]["schedule"].total_seconds()
    storage_quota.publish(over, seconds=max(60.0, 6 * period))
    return over


def _measure(table: Table) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO broker_storagemeasure (stored_table, counted_to, seen_to, measured_at) "
            "VALUES (%s, 0, 0, now()) ON CONFLICT (stored_table) DO NOTHING",
            [table.name],
        )
        # Lock (the table's measure row, to the commit; another measure skips it): measures
        # of two beats would add the same rows twice; deletions wait (see _FORGET_SQL).
        cursor.execute(
            "SELECT counted_to, seen_to FROM broker_storagemeasure WHERE stored_table = %s "
            "FOR UPDATE SKIP LOCKED",
            [table.name],
        )
        row = cursor.fetchone()
        if row is None:
            return
        counted_to, seen_to = row
        cursor.execute(f"SELECT coalesce(max({table.id_column}), 0) FROM {table.name}")  # noqa: S608
        [(top,)] = cursor.fetchall()
        top = max(top, seen_to)
        params: dict[str, Any] = {"table": table.name, "low": counted_to, "high": seen_to}
        cursor.execute(_COUNTED_SQL.format(sums=table.sums_sql()), params)
        cursor.execute(
            "UPDATE broker_storedbytes SET recent = 0 WHERE stored_table = %s AND recent <> 0",
            [table.name],
        )
        params.update(low=seen_to, high=top)
        cursor.execute(_RECENT_SQL.format(sums=table.sums_sql()), params)
        cursor.execute(
            "UPDATE broker_storagemeasure SET counted_to = %s, seen_to = %s, measured_at = now() "
            "WHERE stored_table = %s",
            [seen_to, top, table.name],
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
