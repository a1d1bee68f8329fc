"""Recalling a delayed message before its delivery (RocketMQ 5.3's RecallMessage), for every door
(REST, gRPC): docs/decisions/0055.

A delayed message waits in broker_delayedmessage until the delivery scan (services/delivery.py)
moves it into the commit log, locking its row FOR UPDATE SKIP LOCKED and deleting it in the same
transaction. A recall locks the same row FOR UPDATE (waiting, not skipping) and moves it to
broker_recalledmessage. Whoever locks the row first wins, and the other finds it gone: a recall
that waited behind the scan finds the message in the commit log (409), a scan that found it
locked by a recall skips it, and the recall deletes it. Never both.
"""

from typing import Literal

from django.db import transaction

from apps.broker.access import Principal
from apps.broker.models import (
    CommitLogEntry,
    DelayedMessage,
    HalfMessage,
    RecalledMessage,
    TransactionState,
)
from apps.broker.services import storage_usage
from apps.broker.services.errors import Conflict, NotFound

RecallDoor = Literal["rest", "grpc"]

# The delayed row's columns a recalled row keeps (all but its own id and creation time).
_KEPT = ("id", "created_at")


def message_recall(
    *, msg_id: str, principal: Principal, door: RecallDoor, topic: str | None = None
) -> RecalledMessage:
    """Recalls the delayed message `msg_id`: it is never delivered. Needs a `produce:` scope of
    its producer group (access.Principal.can); another group's message, or one on another topic
    than `topic` (a gRPC recall handle names its topic), is answered as unknown, 404.

    A message recalled already answers its recall again (idempotent, decision 0055). A message
    in the commit log, delivered or visible at once, is 409; so is a transaction not committed
    (roll it back instead) and one rolled back, and a delayed message stored under the id of a
    recalled one before decision 0075 (the id's recall holds it)."""
    principal.require_some("produce")

    def mine(group: str, topic_name: str) -> bool:
        return principal.can("produce", group) and topic in (None, topic_name)

    with transaction.atomic():
        # Lock (before the delayed row and the recalled row's id): decision 0089.
        storage_usage.hold_measure(storage_usage.DELAYED)
        delayed = (
            DelayedMessage.objects.select_for_update(of=("self",))
            .select_related("topic")
            .filter(msg_id=msg_id)
            .first()
        )
        if delayed is not None and mine(delayed.producer_group, delayed.topic.name):
            if RecalledMessage.objects.filter(msg_id=msg_id).exists():
                # A recalled message keeps its id (decision 0075); a delayed message stored under
                # it before that rule cannot take its place in broker_recalledmessage.
                raise Conflict(
                    f"Message {msg_id} cannot be recalled: its id is held by an earlier message."
                )
            kept = {
                field.attname: getattr(delayed, field.attname)
                for field in DelayedMessage._meta.concrete_fields
                if field.attname not in _KEPT
            }
            recalled = RecalledMessage.objects.create(**kept, recalled_by=principal.name, door=door)
            storage_usage.delayed_delete([delayed.pk])
            return recalled
    # Not waiting (or not the caller's): read after the lock above was granted, so a delivery
    # that held the row has committed and its commit-log row is seen here.
    earlier = RecalledMessage.objects.select_related("topic").filter(msg_id=msg_id).first()
    if earlier is not None and mine(earlier.producer_group, earlier.topic.name):
        return earlier
    entry = CommitLogEntry.objects.select_related("topic").filter(msg_id=msg_id).first()
    if entry is not None and mine(entry.producer_group, entry.topic.name):
        raise Conflict(
            f"Message {msg_id} is in the commit log already (delivered): it cannot be recalled.",
            state="DELIVERED",
        )
    half = (
        HalfMessage.objects.select_related("topic", "producer_group").filter(msg_id=msg_id).first()
    )
    if half is not None and mine(half.producer_group.name, half.topic.name):
        if half.state == TransactionState.ROLLED_BACK:
            message = f"Message {msg_id} was rolled back: there is nothing to recall."
        else:
            message = f"Message {msg_id} is a transaction not committed: roll it back instead."
        raise Conflict(message, state=half.state)
    raise NotFound(f"Message {msg_id} does not exist.")
