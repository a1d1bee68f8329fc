"""A process of the test's own killed in the middle of a write transaction, at a point the test
chooses: a session of the test's own holds a lock (a row's, or an advisory lock a trigger of the
test's own waits for) that a statement of the transaction waits for after its first writes; the
test kills the process while it waits, lets the lock go, and Postgres ends the dead client's
transaction (tests/e2e/test_crash_mid_write.py, tests/grpc/test_crash_mid_recall_grpc.py)."""

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from tests.support.statement_faults import own_connection

SECONDS = 20.0


def backend_waiting_for(holder: psycopg.Connection) -> int:
    """The session (of the process to kill) waiting for a lock `holder` holds."""
    with own_connection(autocommit=True) as watcher:
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            rows = watcher.execute(
                "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                [holder.info.backend_pid],
            ).fetchall()
            if rows:
                return int(rows[0][0])
            time.sleep(0.02)
    raise AssertionError("the work's statement never waited for the test's lock")


def wait_gone(pid: int) -> None:
    """Until the session `pid` (its client killed) has ended, its transaction with it."""
    with own_connection(autocommit=True) as watcher:
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            if not watcher.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]
            ).fetchall():
                return
            time.sleep(0.02)
    raise AssertionError(f"the killed process's session {pid} did not end")


def rows(query: str, *params: Any) -> list[tuple[Any, ...]]:
    """What a session of the test's own reads (committed rows only)."""
    with own_connection(autocommit=True) as reader:
        return reader.execute(query, list(params)).fetchall()


def execute(statement: str) -> None:
    """A statement of the test's own, committed at once."""
    with own_connection(autocommit=True) as writer:
        writer.execute(statement)


def call_killed(
    call: Callable[[], Any], kill: Callable[[], None], holder: psycopg.Connection
) -> Any:
    """Makes `call` in a thread, `kill`s its process once the call's statement waits for
    `holder`'s lock, lets the lock go and waits until Postgres has ended the dead client's
    transaction. Returns what the call returned or raised (never an answer of the work)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as error:  # noqa: BLE001 - the caller looks at what it was
            outcome.append(error)

    caller = threading.Thread(target=run)
    caller.start()
    waiting = backend_waiting_for(holder)
    kill()
    caller.join(SECONDS)
    holder.rollback()
    wait_gone(waiting)
    [result] = outcome
    return result


@contextlib.contextmanager
def inserts_wait(
    table: str, lock: int, *, name: str, each: str = "ROW", when: str = ""
) -> Iterator[None]:
    """A trigger of the test's own, dropped after the block: each INSERT into `table` (each ROW,
    or each STATEMENT; only rows matching `when`, if given) waits, before it writes, for the
    advisory lock `lock` while a session of the test holds it (`pg_advisory_xact_lock`)."""
    returned = "NEW" if each == "ROW" else "NULL"
    execute(
        f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN PERFORM pg_advisory_xact_lock_shared({lock}); RETURN {returned}; END $$; "
        f"CREATE TRIGGER {name} BEFORE INSERT ON {table} "
        f"FOR EACH {each} {f'WHEN ({when})' if when else ''} EXECUTE FUNCTION {name}();"
    )
    try:
        yield
    finally:
        execute(f"DROP TRIGGER {name} ON {table}; DROP FUNCTION {name}()")
