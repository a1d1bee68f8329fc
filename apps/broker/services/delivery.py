"""Delayed delivery: messages wait in `broker_delayedmessage` until their time (database clock),
then a scan moves each into the commit log exactly once, with its queue offset assigned then."""

import time
from datetime import datetime, timedelta
from itertools import groupby

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models.functions import Now
from django.utils import timezone

from apps.broker import failpoints, limits
from apps.broker.metrics import DELAY_LATENESS, observe_all
from apps.broker.models import DelayedMessage
from apps.broker.services import scans, storage_usage
from apps.broker.services.errors import invalid
from apps.broker.services.sending import Appended, OutgoingMessage, commit_log_append


def delivery_time(
    *,
    message: OutgoingMessage,
    delay_level: int | None,
    deliver_at: datetime | None,
    start: datetime,
) -> datetime | None:
    """When a message becomes visible: `start` + RocketMQ delay level, or an instant. None: now.

    A message with a message group is never delayed, as in RocketMQ: its place in the group's
    order is its place in the commit log (docs/decisions/0054).

    An instant must lie within `start` +- TXHUB_MAX_DELAY: later is the contract's 400, and a
    time far in the past (year 1 with an offset) would be stored as a timestamp psycopg cannot
    read back, which would poison every later read of the row."""
    if message.message_group and (delay_level is not None or deliver_at is not None):
        raise invalid(
            "message_group",
            "A message with a message group cannot be delayed: its order is its commit order.",
        )
    if delay_level is not None:
        due = start + timedelta(seconds=limits.DELAY_LEVEL_SECONDS[delay_level - 1])
    elif deliver_at is not None:
        due = deliver_at
    else:
        return None
    window = timedelta(seconds=settings.TXHUB_MAX_DELAY)
    limit = f"{settings.TXHUB_MAX_DELAY:.0f} s"
    if due - start > window:
        why = f"The delivery time is more than TXHUB_MAX_DELAY ({limit}) away."
        raise invalid("deliver_at", why)
    if start - due > window:
        why = f"The delivery time is more than TXHUB_MAX_DELAY ({limit}) in the past."
        raise invalid("deliver_at", why)
    return due if due > start else None  # a time in the past is delivered at once


def delayed_deliver_due(*, limit: int | None = None) -> int:
    """Moves due delayed messages into the commit log; returns how many.

    Lock, SKIP LOCKED: two scans (two workers) never move the same message; the delayed row is
    deleted in the same transaction that appends it, so each is delivered exactly once.
    """
    batch = limit or settings.TXHUB_DELIVERY_BATCH
    with transaction.atomic():
        # Lock (before the queues' rows and the offsets the appends take): a measure of the
        # delayed table under way is waited for here, holding nothing (decision 0089).
        storage_usage.hold_measure(storage_usage.DELAYED)
        ids = list(
            DelayedMessage.objects.select_for_update(skip_locked=True, of=("self",))
            # Database clock: never visible before its time, whatever the worker's clock says.
            .filter(deliver_at__lte=Now())
            .exclude(pk__in=scans.skipped("delayed_delivery"))
            .order_by("deliver_at")
            .values_list("pk", flat=True)[:batch]
        )
        # Locked above; read here, row by row if one of them cannot be read back (scans.py).
        due = scans.load_rows(
            DelayedMessage.objects.select_related("topic"), ids, scan="delayed_delivery"
        )
        if failpoints.ARMED:
            failpoints.hit("after_delayed_due_read")
        # Offsets in (topic, queue) order: every appending transaction takes queue locks in the
        # same order, so two scans, or a scan and a send batch, cannot deadlock on them (not in
        # the order due, decision 0093). One append per queue.
        now = timezone.now()
        ordered = sorted(due, key=lambda d: (d.topic_id, d.queue_id, d.deliver_at))
        try:
            with transaction.atomic():
                for _, of_queue in groupby(ordered, key=_queue_of):
                    _append(list(of_queue), now)
        except IntegrityError:
            # One of them cannot be appended: its id is in the commit log already (a message
            # stored before ids were claimed, client_ids.claim_sql). Row by row, each in a
            # savepoint; the bad one is reported and skipped, the others go (scans.py).
            due = [d for d in ordered if _appended_alone(d, now)]
        storage_usage.delayed_delete([d.pk for d in due])
        moved_at = timezone.now()
        lateness = [(moved_at - d.deliver_at).total_seconds() for d in due]
        transaction.on_commit(lambda: observe_all(DELAY_LATENESS, lateness))
    return len(due)


def _queue_of(delayed: DelayedMessage) -> tuple[int, int]:
    return delayed.topic_id, delayed.queue_id


def _append(of_queue: list[DelayedMessage], now: datetime) -> None:
    """Appends delayed messages of one queue to the commit log, in this order."""
    commit_log_append(
        topic_id=of_queue[0].topic_id,
        queue_id=of_queue[0].queue_id,
        entries=[
            Appended(d.msg_id, OutgoingMessage.of(d, d.producer_group), d.born_at, d.transaction_id)
            for d in of_queue
        ],
        now=now,
    )


def _appended_alone(delayed: DelayedMessage, now: datetime) -> bool:
    try:
        with transaction.atomic():
            _append([delayed], now)
    except IntegrityError as error:
        scans.row_failed("delayed_delivery", delayed.pk, error)
        return False
    return True


def seconds_until_next_due() -> float | None:
    """Database clock: how long until the earliest delayed message is due (None: nothing waits)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM (min(deliver_at) - now())) FROM broker_delayedmessage "
            "WHERE NOT (id = ANY(%s))",
            [sorted(scans.skipped("delayed_delivery"))],
        )
        row = cursor.fetchone()
    return None if row is None or row[0] is None else float(row[0])


# While another scan holds every due row, a scan asks again after this pause, doubled each time
# it finds them still held, up to the most; the first delivery after they are let go is late by
# at most that (decision 0115).
HELD_PAUSE_FIRST, HELD_PAUSE_MOST = 0.005, 0.1


def delayed_deliver_for(*, seconds: float) -> int:
    """Delivers what is due, then keeps delivering for `seconds`, sleeping until the next due
    time rather than waiting for the next beat: lateness is processing time, not beat period."""
    deadline = time.monotonic() + seconds
    moved = 0
    pause = HELD_PAUSE_FIRST
    while True:
        # First the one cheap question (an idle txhub asks only this, once a beat).
        wait = seconds_until_next_due()
        left = deadline - time.monotonic()
        # Over at its span's end, also while what is due is held by another scan (its wait is
        # then below zero and would never reach the deadline).
        if wait is None or left <= 0 or wait >= left:
            return moved
        if wait > 0:
            time.sleep(wait)
        batch = delayed_deliver_due()
        moved += batch
        if batch:
            pause = HELD_PAUSE_FIRST
        else:  # due, but another scan holds it (SKIP LOCKED): it delivers it; ask again later
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(2 * pause, HELD_PAUSE_MOST)
