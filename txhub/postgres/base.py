"""Django's PostgreSQL backend; its psycopg pool drops every dead idle connection at once.

After Postgres restarts, every idle connection in a process's pool is dead. psycopg_pool checks
one connection per checkout attempt and sleeps with a growing backoff (1, 2, 4 ... s) between
attempts, so a pool holding ten dead connections made a request wait out its whole checkout
timeout and answer 503 although Postgres had been back for a while (CI saw 20 s of 503s from one
web worker after tests/e2e/test_crash_durability.py; tests/e2e/test_pool_after_restart.py is the
proof). Here the first failed check sweeps the pool (`ConnectionPool.check()`: every idle
connection tested, the dead ones replaced in the background), so the retry after the first
backoff step finds fresh connections.
"""

from typing import Any

from django.db.backends.postgresql import base


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
        try:
            check(connection)
        except Exception:
            # This connection is dead (the caller discards it); so, most likely, are the idle
            # ones beside it: test them all now instead of one per backoff step.
            pool.check()
            raise

    return check_or_sweep
