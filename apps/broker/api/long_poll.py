"""The REST door's part of a receive with `wait_seconds`: the wait itself is both doors'
(apps/broker/waiting.py, docs/decisions/0024 and 0047).

The ASGI handler (txhub/web.py) runs every request, receive included, through Django's normal sync
stack in one worker thread: auth, scopes, throttle, validation, errors are the same code as for
any request. When the handler marks the request (WAIT_OUTSIDE), ReceiveView tries once and, if
nothing was there and the client may wait, answers `{"messages": []}` with a WaitPlan attached
instead of sleeping in its thread. The handler then calls `wait()` here, which holds no thread and
no database connection while it waits: it waits on the process's wake-up hub (waiting.wait) and,
each time it is woken, tries again in a short sync section that gives its connection back to the
pool at its end and renders the answer.
"""

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from django.db import connections
from django.http import HttpResponse
from rest_framework.renderers import JSONRenderer

from apps.broker import waiting, wakeups
from apps.broker.api import output
from apps.broker.api.errors import (
    error_body,
    internal_error_body,
    rendered_error,
)
from apps.broker.services import consuming
from apps.broker.services.errors import Throttled

logger = logging.getLogger(__name__)

# request.META key: set by the ASGI handler, which will do the waiting itself.
WAIT_OUTSIDE = "txhub.wait_outside"
_PLAN = "txhub_wait_plan"

T = TypeVar("T")
RunInThread = Callable[[Callable[[], T]], Awaitable[T]]


def may_wait_outside(request: Any) -> bool:
    return bool(request.META.get(WAIT_OUTSIDE))


def attach(response: HttpResponse, plan: consuming.WaitPlan) -> None:
    setattr(response, _PLAN, plan)


def plan_of(response: HttpResponse) -> consuming.WaitPlan | None:
    plan = getattr(response, _PLAN, None)
    # Only the view's own 200: a middleware that replaced the answer (an error) ends the request.
    return plan if response.status_code == 200 else None


# A try's answer: status, rendered body, the error answer's own headers (a 503's Retry-After).
Attempt = tuple[int, bytes, dict[str, str]]


def _try_again(plan: consuming.WaitPlan) -> Attempt:
    """A sync section: one receive; the answer rendered; the connection back to the pool."""
    try:
        received = consuming.receive_once(plan)
        if not received:
            return 200, b"", {}
        data = {"messages": output.render_many(output.ReceivedOut, received)}
        return 200, JSONRenderer().render(data), {}
    except Exception as error:  # noqa: BLE001 - answered in the contract's format, as DRF would
        rendered = rendered_error(error)
        if rendered is None:
            logger.exception("receive failed while waiting")
            return 500, JSONRenderer().render(internal_error_body()), {}
        return rendered
    finally:
        connections.close_all()


async def wait(
    plan: consuming.WaitPlan,
    response: HttpResponse,
    run_in_thread: RunInThread[Any],
    arrived: float,
) -> HttpResponse:
    """Waits for the plan's messages until its wait time, counted from the request's arrival
    (`arrived`, loop time), is over; returns the answer to send (`response`, still
    `{"messages": []}`, if nothing came)."""

    async def attempt() -> Attempt:
        answer: Attempt = await run_in_thread(lambda: _try_again(plan))
        return answer

    try:
        result = await waiting.wait(
            plan,
            since=arrived,
            attempt=attempt,
            found=lambda answer: answer[0] != 200 or bool(answer[1]),
        )
    except wakeups.Revoked:
        # Answered as the same call with the token would be now (docs/decisions/0034).
        refused = error_body("unauthenticated", "The token is unknown or revoked.")
        return HttpResponse(
            JSONRenderer().render(refused),
            status=401,
            content_type="application/json",
            headers={"WWW-Authenticate": 'Bearer realm="txhub"'},
        )
    except Throttled as error:
        # The token holds its cap of waits (apps/broker/slots.py, docs/decisions/0084): 429.
        return HttpResponse(
            JSONRenderer().render(error_body(error.code, error.message, error.details)),
            status=error.status,
            content_type="application/json",
            headers={"Retry-After": str(error.retry_after)},
        )
    if result is None:
        return response
    status, body, headers = result
    if status != 200:
        return HttpResponse(body, status=status, content_type="application/json", headers=headers)
    response.content = body
    if response.has_header("Content-Length"):
        response["Content-Length"] = str(len(body))
    return response
