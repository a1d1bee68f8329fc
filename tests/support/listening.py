"""Waiting on an observable instead of sleeping: a web server's LISTEN connection that has run
its catch-up check and idles, reading notifications (apps/broker/wakeups.py). The check runs only
for registered waiters, so once it idles a waiter is waiting, and anything stored from then on
reaches it by a NOTIFY or the fallback check, never by a try it was still about to make."""

from datetime import datetime

from django.db import connection

from apps.broker.fallback_reads import RECEIVABLE_SQL
from tests.support.waiting import wait_until


def database_now() -> datetime:
    """The database's clock now (pg_stat_activity's times are the database's)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        now: datetime = cursor.fetchone()[0]
        return now


def listening_hubs(app: str, since: datetime | None = None) -> set[int]:
    """The pids of the LISTEN connections named `app` that idle after their catch-up check (one
    that ran after `since`, when given)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
            "AND datname = current_database() AND state = 'idle' AND btrim(query, E' \\n') LIKE %s "
            "AND (%s::timestamptz IS NULL OR state_change > %s::timestamptz)",
            [app, RECEIVABLE_SQL.strip()[:40] + "%", since, since],
        )
        return {int(pid) for (pid,) in cursor.fetchall()}


def hub_listening(
    app: str, besides: frozenset[int] = frozenset(), since: datetime | None = None
) -> set[int]:
    """Waits until a LISTEN connection named `app` (other than `besides`) listens, after a
    catch-up check run since `since` if given; its pids."""
    hubs = wait_until(lambda: listening_hubs(app, since) - besides, timeout=20, interval=0.05)
    assert hubs, f"no LISTEN connection named {app} came to wait for notifications"
    return set(hubs)
