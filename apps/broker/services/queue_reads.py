"""Statements every receive reads a queue with, a normal group's and a FIFO group's alike
(services/consuming.py, services/fifo.py): plain SQL, the hottest read path (decision 0025)."""

from apps.broker import rows
from apps.broker.models import CommitLogEntry

# A queue's messages from a cursor on, in offset order.
ENTRIES_SQL = (
    f"SELECT {rows.columns(CommitLogEntry, 'e')} FROM broker_commitlogentry e "  # noqa: S608
    "WHERE e.topic_id = %s AND e.queue_id = %s AND e.queue_offset >= %s "
    "ORDER BY e.queue_offset LIMIT %s"
)

# The read cursors moved past what was read: cursor ids and their next offsets, as arrays.
MOVE_CURSORS_SQL = """
UPDATE broker_consumercursor c SET next_offset = m.next_offset
FROM unnest(%(cursor_ids)s::bigint[], %(next_offsets)s::bigint[]) AS m(id, next_offset)
WHERE c.id = m.id
"""
