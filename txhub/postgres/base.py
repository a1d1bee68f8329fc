"""Django's PostgreSQL backend; its psycopg pool checks a connection without a round trip, and
drops every dead idle connection at once.

Checkout check. Django's CONN_HEALTH_CHECKS makes psycopg_pool run an empty query on every
checkout: one more round trip on every request (about a fifth of the hot path's queries). Here a
checkout looks at the idle connection's socket instead (a zero-timeout poll): a connection that
Postgres closed (restart, crash, administrator command) has its end-of-stream or error message
waiting there, so it is readable, and only then is the round-trip check run. A connection whose
peer vanished without a word (no FIN) still fails its first query, as it would with Django's
check between the check and the query.

Sweep. After Postgres restarts, every idle connection in a process's pool is dead. psycopg_pool
checks one connection per checkout attempt and sleeps with a growing backoff (1, 2, 4 ... s)
between attempts, so a pool holding ten dead connections made a request wait out its whole
checkout timeout and answer 503 although Postgres had been back for a while (CI saw 20 s of 503s
from one web worker after tests/e2e/test_crash_durability.py; tests/e2e/test_pool_after_restart.py
is the proof). Here the first failed check sweeps the pool (`ConnectionPool.check()`: every idle
connection tested, the dead ones replaced in the background), so the retry after the first
backoff step finds fresh connections.
"""

import select
from typing import Any

from django.db.backends.postgresql import base
from psycopg import pq


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self) -> Any:
        pool = super().pool
        # `_check` is psycopg_pool's (3.3, pinned) checkout check, set by Django from
        # CONN_HEALTH_CHECKS; wrapped once per pool.
        checked = pool is not None and getattr(pool, "_check", None) is not None
        if checked and not getattr(pool, "_txhub_sweeps", False):
            pool._check = _sweeping_check(pool, pool._check)
            pool._txhub_sweeps = True
        return pool


def _sweeping_check(pool: Any, check: Any) -> Any:
    def check_or_sweep(connection: Any) -> None:
        if _looks_alive(connection):
            return
        try:
            check(connection)
        except Exception:
            # This connection is dead (the caller discards it); so, most likely, are the idle
            # ones beside it: test them all now instead of one per backoff step.
            pool.check()
            raise

    return check_or_sweep


def _looks_alive(connection: Any) -> bool:
    """An idle connection in good state with nothing to read: the server has not closed it."""
    pgconn = connection.pgconn
    if connection.closed or pgconn.status != pq.ConnStatus.OK:
        return False
    if pgconn.transaction_status != pq.TransactionStatus.IDLE:
        return False
    poller = select.poll()
    poller.register(pgconn.socket, select.POLLIN | select.POLLERR | select.POLLHUP)
    return not poller.poll(0)
