"""A receive that may wait (long polling), the same for both doors (docs/decisions/0047).

The REST door (its ASGI handler and the lean door; the WSGI test client too) and the gRPC door's
ReceiveMessage make a waiting receive the same way:

1. `first_try` (a worker thread, with the database): one receive, skipped without a query when
   this process knows the (topic, group, tag filter) empty (wakeups.py, "Known empty",
   decisions 0026 and 0081); when it found nothing and the caller may wait, the plan to wait
   with. The topic's wake-up count is read before the try: a wake-up that arrives after it is
   not missed.
2. `wait` (the event loop, decision 0024): on this process's wake-up hub, woken by NOTIFY or the
   hub's fallback check, trying again in the door's worker thread each time; no thread and no
   connection held meanwhile. The token revoked meanwhile raises wakeups.Revoked (decision 0034).
   Without an event loop (WSGI), `wait_here` polls every TXHUB_LONG_POLL_INTERVAL instead.
   Either holds one of the token's waiting slots while it waits: past its cap the wait is
   refused (slots.py, services.errors.Throttled) before it begins, nothing received or stored
   (docs/decisions/0084).

The doors keep only what is theirs: how a try runs in their threads and how its answer is
written (api/long_poll.py, grpc/consumers.py).
"""

import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from django.conf import settings

from apps.broker import metrics, slots, wakeups
from apps.broker.services import consuming
from apps.broker.services.consuming import Received, WaitPlan

T = TypeVar("T")


def first_try(plan: WaitPlan) -> tuple[list[Received], WaitPlan | None]:
    """What the receive `plan` asks for gets now, and, when that is nothing and it may wait
    (`wait_seconds` > 0), the plan to wait with (`seen` read before the try)."""
    the_hub = wakeups.hub()
    mark = the_hub.mark(plan.topic.pk)
    received: list[Received] = []
    if plan.wait_seconds > 0 and the_hub.known_empty(plan.topic.pk, plan.group.pk, plan.tags):
        # Nothing receivable as far as this process can tell: wait at once, as a woken and
        # unlucky waiter would, without asking Postgres (decision 0026).
        metrics.RECEIVES_KNOWN_EMPTY.inc()
    else:
        received, anything = consuming.receive_now(plan)
        if not anything:
            the_hub.note_empty(plan.topic.pk, plan.group.pk, mark, plan.tags)
    if received or plan.wait_seconds <= 0:
        return received, None
    return received, dataclasses.replace(plan, seen=mark.seen)


async def wait(
    plan: WaitPlan,
    *,
    since: float,
    attempt: Callable[[], Awaitable[T]],
    found: Callable[[T], bool],
) -> T | None:
    """Waits for the plan's messages until its wait time, counted from `since` (loop time), is
    over: each time the hub wakes it, `attempt` (the door's `consuming.receive_once(plan)` in a
    worker thread) again; the first result `found` accepts, or None. Raises wakeups.Revoked, and
    Throttled when the token holds its cap of waits (slots.py)."""
    with slots.held(plan.token_id, slots.Kind.WAIT):
        return await wakeups.wait(
            topic_id=plan.topic.pk,
            group_id=plan.group.pk,
            seen=plan.seen,
            deadline=since + plan.wait_seconds,
            attempt=attempt,
            found=found,
            wants=plan.max_messages,
            tags=plan.tags,
            token_id=plan.token_id,
        )


def wait_here(plan: WaitPlan, *, since: float) -> list[Received]:
    """The wait without an event loop (WSGI: the Django test client), holding the thread: a try
    every TXHUB_LONG_POLL_INTERVAL seconds until the wait time, counted from `since`
    (time.monotonic()), is over. Throttled as `wait`."""
    deadline = since + plan.wait_seconds
    with slots.held(plan.token_id, slots.Kind.WAIT):
        while (remaining := deadline - time.monotonic()) > 0:
            time.sleep(min(settings.TXHUB_LONG_POLL_INTERVAL, remaining))
            received = consuming.receive_once(plan)
            if received:
                return received
    return []
