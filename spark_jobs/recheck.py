"""Re-checks candidate findings against the live database with point queries, one per kind.

The job reads tables one after another without holding a transaction open, so a transaction
that resolves while it reads can look inconsistent (its half read before the commit, its log
row after). A candidate is reported only if the same disagreement is still true now.
"""

from collections.abc import Iterable
from typing import Any

import psycopg

EXPECTED_STATE_SQL = """COALESCE(
    (SELECT min(CASE o.op WHEN 'COMMIT' THEN 'COMMITTED' ELSE 'ROLLED_BACK' END)
     FROM broker_oprecord o WHERE o.half_id = h.id AND o.op IN ('COMMIT', 'ROLLBACK')),
    (SELECT CASE o.op WHEN 'PARK' THEN 'PARKED' ELSE 'PREPARED' END
     FROM broker_oprecord o WHERE o.half_id = h.id AND o.op IN ('PARK', 'RESUME')
     ORDER BY o.at DESC, o.id DESC LIMIT 1),
    'PREPARED')"""

HALF_BY_ID = (
    "SELECT h.transaction_id::text FROM broker_halfmessage h "
    "WHERE h.transaction_id = ANY(%(keys)s::uuid[]) AND "
)
HAS_OP = "EXISTS (SELECT 1 FROM broker_oprecord o WHERE o.half_id = h.id AND o.op = '{op}')"
IN_LOG = "EXISTS (SELECT 1 FROM broker_commitlogentry l WHERE l.transaction_id = h.transaction_id)"
DELAYED = "EXISTS (SELECT 1 FROM broker_delayedmessage d WHERE d.transaction_id = h.transaction_id)"
# A committed delayed transaction recalled before its delivery (docs/decisions/0055) is in
# neither the log nor the delayed table, and nothing was lost.
RECALLED = (
    "EXISTS (SELECT 1 FROM broker_recalledmessage r WHERE r.transaction_id = h.transaction_id)"
)

# Each query takes the candidates' keys and returns those for which the finding still holds.
# Composed of constants only; the keys are bound by the server.
STILL_TRUE = {
    "LOST_COMMIT": HALF_BY_ID
    + HAS_OP.format(op="COMMIT")
    + f" AND NOT {IN_LOG} AND NOT {DELAYED} AND NOT {RECALLED}",
    "LEAKED_ROLLBACK": HALF_BY_ID
    + HAS_OP.format(op="ROLLBACK")
    + f" AND {IN_LOG} AND NOT "
    + HAS_OP.format(op="COMMIT"),
    "CONFLICTING_OUTCOMES": HALF_BY_ID  # noqa: S608 - constants only
    + "(SELECT count(*) FROM broker_oprecord o "
    "WHERE o.half_id = h.id AND o.op IN ('COMMIT', 'ROLLBACK')) > 1",
    "DUPLICATE_LOG_ROW": "SELECT transaction_id::text FROM broker_commitlogentry "
    "WHERE transaction_id = ANY(%(keys)s::uuid[]) GROUP BY transaction_id HAVING count(*) > 1",
    "PHANTOM_LOG_ROW": "SELECT DISTINCT l.transaction_id::text FROM broker_commitlogentry l "
    "WHERE l.transaction_id = ANY(%(keys)s::uuid[]) AND NOT EXISTS (SELECT 1 FROM "
    "broker_halfmessage h JOIN broker_oprecord o ON o.half_id = h.id "
    "AND o.op IN ('COMMIT', 'ROLLBACK') "
    "WHERE h.transaction_id = l.transaction_id)",
    "STATE_DRIFT": HALF_BY_ID + f"h.state <> {EXPECTED_STATE_SQL}",
    "STUCK": HALF_BY_ID + "h.state = 'PREPARED' "
    "AND h.born_at < now() - make_interval(secs => %(max_pending_age)s)",
    "LATE_DELAY": "SELECT id FROM broker_delayedmessage WHERE id = ANY(%(keys)s::bigint[]) "
    "AND deliver_at < now() - interval '60 seconds'",
}


def key_of(candidate: dict[str, Any]) -> Any:
    return (
        candidate["delayed_id"]
        if candidate["kind"] == "LATE_DELAY"
        else candidate["transaction_id"]
    )


def still_true(
    conninfo: str, candidates: Iterable[dict[str, Any]], *, max_pending_age: float
) -> list[dict[str, Any]]:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for candidate in candidates:
        by_kind.setdefault(candidate["kind"], []).append(candidate)
    confirmed: list[dict[str, Any]] = []
    # Autocommit: each point query sees the latest committed state, no transaction stays open.
    with psycopg.connect(conninfo, autocommit=True) as connection:
        for kind, group in sorted(by_kind.items()):
            keys = sorted({key_of(c) for c in group})
            rows = connection.execute(
                STILL_TRUE[kind], {"keys": keys, "max_pending_age": max_pending_age}
            ).fetchall()
            holding = {row[0] for row in rows}
            confirmed.extend(c for c in group if key_of(c) in holding)
    return confirmed
