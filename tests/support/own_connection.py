"""Work on a database connection of its own, in a thread of its own: how the race tests run
concurrent transactions against the real Postgres (each thread's Django connection is closed
after it, and its result or exception comes back through a future, never swallowed)."""

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from django.db import connection

T = TypeVar("T")


def on_own_connection(work: Callable[[], T]) -> Callable[[], T]:
    """`work`, closing the calling thread's connection after it (for a pool's threads)."""

    def run() -> T:
        try:
            return work()
        finally:
            connection.close()

    return run


def in_thread(work: Callable[[], T]) -> Future[T]:
    """`work` in a thread of its own, on its own connection; its result or exception comes back."""
    pool = ThreadPoolExecutor(1)
    future = pool.submit(on_own_connection(work))
    pool.shutdown(wait=False)
    return future
