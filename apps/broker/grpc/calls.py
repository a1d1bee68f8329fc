"""Running the synchronous services from grpc.aio handlers, and the long poll's wait."""

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from django.db import DatabaseError, close_old_connections

from apps.broker import limits, waiting, wakeups
from apps.broker.grpc.protocol import (
    Code,
    Refusal,
    Unreachable,
    limit_refusal,
    refusal_of,
    status,
    unavailable_refusal,
)
from apps.broker.services import consuming
from apps.broker.services.consuming import Received, WaitPlan
from apps.broker.services.errors import BrokerError, database_unreachable_here

log = logging.getLogger("txhub.grpc")
T = TypeVar("T")


def _in_thread(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    # What Django's request_started/finished do for a web request: a connection past its
    # CONN_MAX_AGE or broken (Postgres restarted) is replaced before it is used.
    close_old_connections()
    try:
        return fn(*args, **kwargs)
    except DatabaseError as error:
        # Asked in this thread, the query's own: an unreachable database is HA_NOT_AVAILABLE,
        # which clients retry; any other error is this call's own (docs/decisions/0070).
        if database_unreachable_here(error):
            raise Unreachable(str(error)) from error
        raise


async def db(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Runs a service (ORM, blocking) on the loop's thread pool: each pool thread keeps its own
    connection, and no handler blocks the event loop that carries every other client's calls.
    The executor directly, as the lean door's hot calls (txhub/web.py): nothing the thread runs
    reads a context set on the loop, so asgiref's bookkeeping around it is only cost; and a hot
    RPC makes one such hop, its whole synchronous part (docs/decisions/0052)."""
    work = functools.partial(_in_thread, fn, args, kwargs)
    return await asyncio.get_running_loop().run_in_executor(None, work)


async def wait_more(plan: WaitPlan, *, since: float) -> list[Received]:
    """The long poll's wait, both doors' (apps/broker/waiting.py, decision 0047): each try in
    this pool, until the plan's wait time counted from `since` (loop time) is up. The token
    revoked meanwhile: UNAUTHORIZED, as a call with it would be now (docs/decisions/0034)."""

    async def attempt() -> list[Received]:
        return await db(consuming.receive_once, plan)

    try:
        woken = await waiting.wait(plan, since=since, attempt=attempt, found=bool)
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
