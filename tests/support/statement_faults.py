"""Real database faults for one request, at any door and in any process on the test database.

A table is locked by a session of the test's own; the request's statement waits on that lock, and
Postgres then ends it as a fault would:
- "timeout": the statement runs out its session's `statement_timeout` (57014), set by the caller;
- "cancel": it is cancelled (`pg_cancel_backend`, 57014 too): one query failed, the connection
  is fine;
- "terminate": its session is ended (`pg_terminate_backend`, 57P01), as a failover or a restart
  ends every session: the database is gone for that connection;
- "cut": every connection through a `CuttingProxy` is closed, as a crash of the database's
  machine or a network partition closes them: libpq's own error, with no SQLSTATE, on a broken
  connection (the waiting session is then terminated too, so that it stores nothing).
Nothing is mocked: the error is the one Postgres and psycopg raise (docs/decisions/0078)."""

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import psycopg
from django.db import connection

from tests.support.proxy import TcpProxy, pipe

Ending = Literal["timeout", "cancel", "terminate", "cut"]

# How long the waiting statement is looked for; then the lock is let go (no request hangs).
FIND_SECONDS = 10.0


def own_connection(*, autocommit: bool) -> psycopg.Connection:
    """A session of the test's own on the test database, outside Django's pool."""
    params = connection.get_connection_params()
    for name in ("cursor_factory", "context", "prepare_threshold", "pool"):
        params.pop(name, None)
    return psycopg.connect(**params, autocommit=autocommit)


def _waiting_on(watcher: psycopg.Connection, table: str, holder: int) -> list[int]:
    rows = watcher.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'relation' AND NOT granted "
        "AND relation = %s::regclass AND pid <> %s",
        [table, holder],
    ).fetchall()
    return [row[0] for row in rows]


class CuttingProxy(TcpProxy):
    """Forwards 127.0.0.1:<port> to Postgres; `cut()` closes every connection open through it."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        super().__init__(upstream)

    def serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream, timeout=30)
        except OSError:
            client.close()
            return
        server.settimeout(None)
        with self._lock:
            self._open.append(client)
        threading.Thread(target=pipe, args=(server, client), daemon=True).start()
        pipe(client, server)

    def cut(self) -> None:
        with self._lock:
            opened, self._open = self._open, []
        for sock in opened:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Ender(threading.Thread):
    """Ends every statement that waits on the lock once one does (but "timeout"). If the
    block has not ended within FIND_SECONDS, ends the holder's session instead: the lock is let
    go, the request goes on and the test fails on its answer rather than hanging."""

    def __init__(self, table: str, holder: int, ending: Ending, proxy: CuttingProxy | None) -> None:
        super().__init__(daemon=True)
        self.table, self.holder, self.ending, self.proxy = table, holder, ending, proxy
        self.block_done = threading.Event()
        self.ended: list[int] = []

    def run(self) -> None:
        function = "pg_cancel_backend" if self.ending == "cancel" else "pg_terminate_backend"
        with own_connection(autocommit=True) as watcher:
            deadline = time.monotonic() + FIND_SECONDS
            while time.monotonic() < deadline and not self.block_done.is_set():
                waiting = _waiting_on(watcher, self.table, self.holder)
                if waiting and self.ending != "timeout" and not self.ended:
                    if self.proxy is not None:
                        self.proxy.cut()  # first: the client sees the cut, not what follows
                    for pid in waiting:
                        watcher.execute(f"SELECT {function}(%s)", [pid])  # noqa: S608 - ours
                    self.ended = waiting
                time.sleep(0.02)
            if not self.block_done.is_set():
                watcher.execute("SELECT pg_terminate_backend(%s)", [self.holder])


@contextmanager
def statement_ended(
    table: str, ending: Ending, proxy: CuttingProxy | None = None
) -> Iterator[list[int]]:
    """Within the block, a statement on `table` waits, then is ended as `ending` says ("cut":
    through `proxy`); the list yielded holds, after the block, the sessions whose statements were
    ended. "timeout" ends none itself: the waiting session's statement_timeout does."""
    assert (ending == "cut") is (proxy is not None)
    holder = own_connection(autocommit=False)
    ended: list[int] = []
    ender = None
    try:
        holder.execute("SET lock_timeout = '5s'")  # never wait on the test's own transaction
        holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        ender = _Ender(table, holder.info.backend_pid, ending, proxy)
        ender.start()
        yield ended
    finally:
        if ender is not None:
            ender.block_done.set()
            ender.join(FIND_SECONDS + 5)
            ended.extend(ender.ended)
        holder.close()  # the lock goes with the session
