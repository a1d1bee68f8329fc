"""Running the synchronous services from grpc.aio handlers, and the long poll's wait."""

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from apps.broker import limits, wakeups
from apps.broker.grpc.protocol import (
    Code,
    Refusal,
    limit_refusal,
    refusal_of,
    status,
    unavailable_refusal,
)
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


async def wait_for(
    fetch: Callable[[], list[T]], *, seconds: float, topic_id: int, group_id: int, token_id: int
) -> list[T]:
    """The long poll: `fetch` now and, while nothing is there, each time this process's wake-up
    hub says the topic may have something for the group (Postgres NOTIFY from the commit, send,
    delayed delivery or resend that made it receivable, with the hub's fallback check), until
    `seconds` are up. The same wait as the REST door's (apps/broker/wakeups.py); no thread or
    connection is held while waiting. The token revoked meanwhile: UNAUTHORIZED, as a call with
    it would be now (docs/decisions/0034)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    seen = wakeups.hub().seen(topic_id)  # before the first try: a wake-up after it is not missed
    found = await db(fetch)
    if found or seconds <= 0:
        return found

    async def attempt() -> list[T]:
        return await db(fetch)

    try:
        woken = await wakeups.wait(
            topic_id=topic_id,
            group_id=group_id,
            seen=seen,
            deadline=deadline,
            attempt=attempt,
            found=bool,
            token_id=token_id,
        )
    except wakeups.Revoked:
        raise Refusal(Code.UNAUTHORIZED, "The access key was revoked.") from None
    return woken or []


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
            except Exception as error:
                down = unavailable_refusal(error)
                if down is not None:
                    log.warning("gRPC %s: %s", method.__name__, error)
                    return response(status=status(down.code, down.message))
                log.exception("gRPC %s failed", method.__name__)
                return response(status=status(Code.INTERNAL_ERROR, "Internal error."))

        return handler

    return wrap
