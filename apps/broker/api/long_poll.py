"""The waiting part of a receive with `wait_seconds`, on the event loop (docs/decisions/0024).

The ASGI handler (txhub/web.py) runs every request, receive included, through Django's normal sync
stack in one worker thread: auth, scopes, throttle, validation, errors are the same code as for
any request. When the handler marks the request (WAIT_OUTSIDE), ReceiveView tries once and, if
nothing was there and the client may wait, answers `{"messages": []}` with a WaitPlan attached
instead of sleeping in its thread. The handler then calls `wait()` here, which holds no thread and
no database connection while it waits: it waits on the process's wake-up hub and, each time it is
woken, tries again in a short sync section that gives its connection back to the pool at its end.
"""

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from django.db import connections
from django.http import HttpResponse
from rest_framework.renderers import JSONRenderer

from apps.broker import wakeups
from apps.broker.api import output
from apps.broker.api.errors import error_body, exception_handler
from apps.broker.models import ConsumerGroup, Topic
from apps.broker.services import consuming

logger = logging.getLogger(__name__)

# request.META key: set by the ASGI handler, which will do the waiting itself.
WAIT_OUTSIDE = "txhub.wait_outside"
_PLAN = "txhub_wait_plan"

T = TypeVar("T")
RunInThread = Callable[[Callable[[], T]], Awaitable[T]]


def may_wait_outside(request: Any) -> bool:
    return bool(request.META.get(WAIT_OUTSIDE))


def first_try(
    *,
    group: ConsumerGroup,
    topic: Topic,
    max_messages: int,
    invisible_seconds: int,
    tags: frozenset[str] | None,
) -> tuple[list[consuming.Received], int]:
    """The try a waiting receive makes before it waits, and the topic's wake-up count read before
    it (the plan's `seen`). Skipped, without a query, when this process knows the pair is empty
    (wakeups.py, "Known empty"): 500 consumers asking again every few seconds then cost Postgres
    nothing."""
    the_hub = wakeups.hub()
    mark = the_hub.mark(topic.pk)
    if the_hub.known_empty(topic.pk, group.pk):
        return [], mark.seen
    received, anything = consuming.message_receive_now(
        group=group,
        topic=topic,
        max_messages=max_messages,
        invisible_seconds=invisible_seconds,
        tags=tags,
    )
    if not anything:
        the_hub.note_empty(topic.pk, group.pk, mark)
    return received, mark.seen


def attach(response: HttpResponse, plan: consuming.WaitPlan) -> None:
    setattr(response, _PLAN, plan)


def plan_of(response: HttpResponse) -> consuming.WaitPlan | None:
    plan = getattr(response, _PLAN, None)
    # Only the view's own 200: a middleware that replaced the answer (an error) ends the request.
    return plan if response.status_code == 200 else None


def _try_again(plan: consuming.WaitPlan) -> tuple[int, bytes]:
    """A sync section: one receive; the answer rendered; the connection back to the pool."""
    try:
        received = consuming.receive_once(plan)
        if not received:
            return 200, b""
        data = {"messages": output.render_many(output.ReceivedOut, received)}
        return 200, JSONRenderer().render(data)
    except Exception as error:  # noqa: BLE001 - answered in the contract's format, as DRF would
        handled = exception_handler(error, {})
        if handled is None:
            logger.exception("receive failed while waiting")
            body = error_body("internal_error", "Something went wrong on our side; it is logged.")
            return 500, JSONRenderer().render(body)
        return handled.status_code, JSONRenderer().render(handled.data)
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

    async def attempt() -> tuple[int, bytes]:
        answer: tuple[int, bytes] = await run_in_thread(lambda: _try_again(plan))
        return answer

    try:
        result = await wakeups.wait(
            topic_id=plan.topic.pk,
            group_id=plan.group.pk,
            seen=plan.seen,
            deadline=arrived + plan.wait_seconds,
            attempt=attempt,
            found=lambda answer: answer[0] != 200 or bool(answer[1]),
            wants=plan.max_messages,
            token_id=plan.token_id,
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
    if result is None:
        return response
    status, body = result
    if status != 200:
        return HttpResponse(body, status=status, content_type="application/json")
    response.content = body
    if response.has_header("Content-Length"):
        response["Content-Length"] = str(len(body))
    return response
