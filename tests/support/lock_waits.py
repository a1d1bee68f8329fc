"""Seeing a statement of another session wait for a row lock, from the test: how the race tests
know that a transaction has reached the lock the test arranged for it to meet."""

import time
from collections.abc import Callable

from django.db import connection

BOUND = 10  # seconds a step may take (a bound, not a measurement)


def waiting_for_a_lock(statement: str) -> bool:
    """Some backend runs a statement containing `statement` and waits for a row lock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND strpos(query, %s) > 0 AND pid <> pg_backend_pid()",
            [statement],
        )
        return int(cursor.fetchone()[0]) > 0


def until(condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False
