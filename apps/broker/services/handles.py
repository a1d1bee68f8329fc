"""Receipt handles: their shape, and the one rule of when a handle is live. A handle names its
delivery and the token of its latest receive; it is live while that delivery is in flight for
the handle's group and its invisible time has not run out. An ack, a change of invisible time
and a consumer's own dead-lettering act only on a live handle."""

import re
import secrets
from datetime import datetime

from django.db.models import QuerySet

from apps.broker.models import ConsumerGroup, Delivery, DeliveryState, Topic

# "<delivery id>.<token>": the id in ASCII digits that fit bigint (isdigit() would take "²"),
# the token as issued (secrets.token_hex). Anything else is an invalid handle, never a query.
_HANDLE_RE = re.compile(r"([0-9]{1,19})\.([0-9a-f]{1,32})")
_MAX_BIGINT = 2**63 - 1

# The live-handle rule in SQL, for statements over many handles at once (the ack): the same
# condition as `live`, with the group, the clock and the (id, token) pairs bound by the caller.
LIVE_SQL = (
    "group_id = %(group)s AND state = %(inflight)s AND invisible_until > %(now)s "
    "AND (id, handle_token) IN (SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::text[]))"
)


def receipt_handle_of(delivery: Delivery) -> str:
    return f"{delivery.pk}.{delivery.handle_token}"


def parse_handle(handle: str) -> tuple[int, str] | None:
    match = _HANDLE_RE.fullmatch(handle)
    if match is None or int(match[1]) > _MAX_BIGINT:
        return None
    return int(match[1]), match[2]


def live(
    *, group: ConsumerGroup, handle: str, now: datetime, topic: Topic | None = None
) -> QuerySet[Delivery]:
    """The handle's delivery while the handle is live (empty otherwise, or if malformed)."""
    parsed = parse_handle(handle)
    if parsed is None:
        return Delivery.objects.none()
    held = Delivery.objects.filter(
        pk=parsed[0],
        handle_token=parsed[1],
        group=group,
        state=DeliveryState.INFLIGHT,
        invisible_until__gt=now,
    )
    return held if topic is None else held.filter(topic=topic)


def hand_out(delivery: Delivery, invisible_until: datetime, now: datetime) -> None:
    """A receive of `delivery`: one more attempt, a new handle (the earlier ones die)."""
    delivery.attempts += 1
    delivery.invisible_until = invisible_until
    delivery.handle_token = secrets.token_hex(12)
    delivery.last_received_at = now
