"""Running the synchronous services from grpc.aio handlers, and the long poll's wait."""

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from apps.broker import limits
from apps.broker.grpc.protocol import Code, Refusal, limit_refusal, refusal_of, status
from apps.broker.services.errors import BrokerError

log = logging.getLogger("txhub.grpc")
T = TypeVar("T")


def _in_thread(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    # What Django's request_started/finished do for a web request: a connection past its
    # CONN_MAX_AGE or broken (Postgres restarted) is replaced before it is used.
    close_old_connections()
    return fn(*args, **kwargs)


async def db(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Runs a service (ORM, blocking) on the loop's thread pool: each pool thread keeps its own
    connection, and no handler blocks the event loop that carries every other client's calls."""
    call = sync_to_async(_in_thread, thread_sensitive=False)
    return await call(fn, args, kwargs)


async def wait_for(fetch: Callable[[], list[T]], *, seconds: float) -> list[T]:
    """The long poll: `fetch` now and then every TXHUB_LONG_POLL_INTERVAL until it finds
    something or `seconds` are up. No thread or connection is held while waiting. The one place
    to swap for a LISTEN/NOTIFY wake-up (the REST door's receive polls the same way)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        found = await db(fetch)
        remaining = deadline - loop.time()
        if found or remaining <= 0:
            return found
        await asyncio.sleep(min(settings.TXHUB_LONG_POLL_INTERVAL, remaining))


Handler = Callable[[Any, Any, Any], Awaitable[Any]]


def unary(response: Any, *, not_found: int = Code.NOT_FOUND) -> Callable[[Handler], Handler]:
    """Every answer carries a status: a refusal, a service's error or a limit becomes the
    protocol's code in the response (never a bare gRPC error the clients cannot read)."""

    def wrap(method: Handler) -> Handler:
        @functools.wraps(method)
        async def handler(self: Any, request: Any, context: Any) -> Any:
            try:
                return await method(self, request, context)
            except Refusal as refused:
                return response(status=status(refused.code, refused.message))
            except BrokerError as error:
                mapped = refusal_of(error, not_found=not_found)
                return response(status=status(mapped.code, mapped.message))
            except limits.LimitError as error:
                limited = limit_refusal(error)
                return response(status=status(limited.code, limited.message))
            except Exception:
                log.exception("gRPC %s failed", method.__name__)
                return response(status=status(Code.INTERNAL_ERROR, "Internal error."))

        return handler

    return wrap
