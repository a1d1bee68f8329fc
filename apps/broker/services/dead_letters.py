"""The dead-letter queue of a consumer group: the one rule that moves an exhausted delivery
there (on a receive, or the periodic scan), a consumer giving up on a message
(ForwardMessageToDeadLetterQueue), and an operator sending one back."""

import secrets
from datetime import datetime

from django.db import connection, transaction
from django.db.models import Case, Q, Value, When
from django.utils import timezone

from apps.broker.models import AuditAction, ConsumerGroup, Delivery, DeliveryState, Topic
from apps.broker.services import handles, scans
from apps.broker.services.audit import SYSTEM, Origin, audit_record
from apps.broker.services.errors import NotFound, invalid
from apps.broker.services.sending import RECEIVABLE_CHANNEL, notify_receivable

# The dead-letter rule, once: an in-flight delivery whose invisible time ran out and that used all
# of its group's attempts moves to the group's dead-letter queue. A conditional UPDATE: a
# concurrent ack or receive of the same row is re-checked by Postgres. `now` is the receive's
# clock; the periodic scan passes none and Postgres' own is used (a worker's skewed clock must
# not expire what a consumer still holds).
# A FIFO group's message dead-lettered frees its message group: the next one is announced at
# the commit (decision 0054).
# The groups: a receive's own (its transaction holds it against a deletion: group_locks.py), or
# for the periodic scan those no deletion is under way for, each held FOR KEY SHARE before any of
# its deliveries is touched. A group being deleted is skipped (its deliveries are going): else the
# scan's UPDATE, taking the group's expired deliveries in its index's order, and the deletion's
# DELETE, taking them in the table's, could each hold a row the other waits for, a deadlock
# (docs/decisions/0088).
_RECEIVE_GROUPS = "broker_consumergroup"
_SCAN_GROUPS = """(
    SELECT id, max_delivery_attempts FROM broker_consumergroup
    WHERE id = ANY(%(groups)s::bigint[]) FOR KEY SHARE SKIP LOCKED
)"""
_DEAD_LETTER_SQL = f"""
WITH dead AS (
    UPDATE broker_delivery d SET state = %(dlq)s,
        dlq_at = coalesce(%(now)s::timestamptz, statement_timestamp())
    FROM {{groups}} g WHERE g.id = ANY(%(groups)s::bigint[]) AND d.group_id = g.id
        AND (%(topic)s::bigint IS NULL OR d.topic_id = %(topic)s::bigint)
        AND d.state = %(inflight)s
        AND d.invisible_until <= coalesce(%(now)s::timestamptz, statement_timestamp())
        AND d.attempts >= g.max_delivery_attempts
    RETURNING d.topic_id, d.message_group
)
SELECT (SELECT count(*) FROM dead), (
    SELECT count(pg_notify('{RECEIVABLE_CHANNEL}', concat_ws(' ', topic_id, 'released')))
    FROM (SELECT DISTINCT topic_id FROM dead WHERE message_group <> '') freed
)
"""  # noqa: S608 - composed of constants only


def _dead_letter(
    group_ids: list[int], topic: Topic | None, now: datetime | None, *, scan: bool = False
) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            _DEAD_LETTER_SQL.format(groups=_SCAN_GROUPS if scan else _RECEIVE_GROUPS),
            {
                "dlq": DeliveryState.DLQ,
                "inflight": DeliveryState.INFLIGHT,
                "groups": group_ids,
                "topic": None if topic is None else topic.pk,
                "now": now,
            },
        )
        row = cursor.fetchone()
    assert row is not None  # noqa: S101 - a SELECT of two expressions has one row
    return int(row[0])


def dead_letter_exhausted(*, group: ConsumerGroup, topic: Topic | None, now: datetime) -> int:
    """The group's exhausted messages (of `topic`) go to its dead-letter queue, by `now`."""
    return _dead_letter([group.pk], topic, now)


def deliveries_expire() -> int:
    """Periodic: dead-letter every exhausted message, even in groups nobody receives from now."""
    ids = ConsumerGroup.objects.exclude(pk__in=scans.skipped("deliveries_expire")).values_list(
        "pk", flat=True
    )
    # The groups are read back first, each on its own if one cannot be (scans.py); then one UPDATE
    # for all of them, which never reads a delivery's columns into Python.
    groups = scans.load_rows(ConsumerGroup.objects.all(), ids, scan="deliveries_expire")
    if not groups:
        return 0
    return _dead_letter([group.pk for group in groups], None, None, scan=True)


def message_dead_letter(
    *, group: ConsumerGroup, receipt_handle: str, topic: Topic | None = None
) -> Delivery:
    """Moves a message its consumer gives up on (RocketMQ's ForwardMessageToDeadLetterQueue)
    into the group's dead-letter queue at once: the DLQ that `dlq_list` shows (REST, console)
    and `dlq_resend` empties, the same one exhausted deliveries reach on expiry."""
    now = timezone.now()
    # A conditional UPDATE: a concurrent ack, change or redelivery of the row is re-checked by
    # Postgres under its row lock, so exactly one of them wins.
    held = handles.live(group=group, handle=receipt_handle, now=now, topic=topic)
    parsed = handles.parse_handle(receipt_handle)
    delivery = None
    if parsed is not None and held.update(state=DeliveryState.DLQ, dlq_at=now):
        delivery = Delivery.objects.select_related("message").get(pk=parsed[0])
    if delivery is None:
        raise invalid("receipt_handle", "The receipt handle is expired or unknown.")
    if delivery.message_group:  # a FIFO group's next message is receivable (decision 0054)
        notify_receivable(topic_id=delivery.topic_id, what="released")
    return delivery


@transaction.atomic
def dlq_resend(*, group: ConsumerGroup, msg_id: str, origin: Origin = SYSTEM) -> Delivery:
    """Puts a dead-lettered message back: receivable at once, with a fresh attempt count. In a
    FIFO group, a message of a message group goes back into its group's order: held, the first of
    the group to be handed out once nothing of the group is in flight (decision 0054)."""
    now = timezone.now()
    updated = Delivery.objects.filter(
        Q(message__msg_id=msg_id), group=group, state=DeliveryState.DLQ
    ).update(
        state=Case(
            When(~Q(message_group=""), then=Value(DeliveryState.HELD)),
            default=Value(DeliveryState.INFLIGHT),
        ),
        attempts=0,
        invisible_until=now,
        handle_token=secrets.token_hex(12),
        dlq_at=None,
    )
    if not updated:
        raise NotFound(f"Message {msg_id} is not in the dead-letter queue of {group.name}.")
    delivery = Delivery.objects.get(group=group, message__msg_id=msg_id)
    audit_record(
        action=AuditAction.DLQ_RESEND, origin=origin, target=group.name, detail={"msg_id": msg_id}
    )
    # Receivable now: a consumer of the group waiting on the topic is woken at our commit.
    notify_receivable(topic_id=delivery.topic_id, what=f"resend {msg_id}")
    return delivery
