"""txhub's gRPC door served in the test's own process: the server `manage.py grpcserver` builds
(apps/broker/grpc/server.py, `new_server`), on an event loop of its own in a thread of its own,
so that a test sees what the door logs (caplog) where a server process's log is only text. Each
database call runs on the loop's thread pool, as in the real server, on a connection closed
after it (the test database is dropped at the end of the session)."""

import asyncio
import functools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from apps.broker.grpc.server import new_server
from tests.support.own_connection import on_own_connection
from tests.support.ports import free_port

P = ParamSpec("P")
T = TypeVar("T")
BOUND = 20.0  # seconds the server may take to start or stop (a bound, not a measurement)


class _ClosingPool(ThreadPoolExecutor):
    """The loop's pool: each call's Django connection is closed after it."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        return super().submit(on_own_connection(functools.partial(fn, *args, **kwargs)))


@contextmanager
def grpc_in_process() -> Iterator[str]:
    """The server's address while the block runs; stopped after it, its RPCs cancelled."""
    port = free_port()
    loop = asyncio.new_event_loop()
    pool = _ClosingPool(max_workers=4, thread_name_prefix="grpc-in-process")
    loop.set_default_executor(pool)
    started: Future[asyncio.Event] = Future()

    async def serve() -> None:
        server = new_server(process="test-in-process")
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        stop = asyncio.Event()
        started.set_result(stop)
        await stop.wait()
        await server.stop(grace=None)

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(serve())
        except BaseException as error:  # noqa: BLE001 - reported to the test by `started`
            if not started.done():
                started.set_exception(error)
            raise

    thread = threading.Thread(target=run, name="grpc-in-process-loop", daemon=True)
    thread.start()
    stop = started.result(timeout=BOUND)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=BOUND)
        pool.shutdown(wait=True)
        loop.close()
