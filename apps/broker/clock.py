"""The database's clock: what decides whether something is due.

Web processes, Celery workers and Postgres may disagree about the time (a VM resumed from a
snapshot, an NTP step, a container with its own clock). Every "is it due yet" decision and every
deadline it writes is taken from Postgres, so one skewed worker cannot check a transaction early,
dead-letter a message its consumer still holds, or put the next check ten minutes out
(docs/decisions/0020)."""

from datetime import datetime

from django.db import connection


def db_now() -> datetime:
    """Postgres' statement_timestamp(): one round trip, in UTC like timezone.now()."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        [(stamp,)] = cursor.fetchall()
    return stamp  # type: ignore[no-any-return]
