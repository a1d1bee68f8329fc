"""SendMessage: a request of 1..64 messages for one topic is checked as a whole, every message
turned into what its service takes, before anything of it is stored; then all of it is stored,
or none (CONTRACT section 6, invariant 9)."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.broker import access, limits, selectors
from apps.broker.grpc.auth import Caller
from apps.broker.grpc.protocol import (
    Code,
    Refusal,
    enum_name,
    limit_refusal,
    pb,
    refusal_of,
    rpc,
    status,
    to_datetime,
)
from apps.broker.grpc.recall import handle_of
from apps.broker.grpc.resources import topic_of
from apps.broker.models import ProducerGroup, Resolver, Topic
from apps.broker.services import delivery, sending, transactions
from apps.broker.services.errors import BrokerError
from apps.broker.services.transactions import Actor


@dataclass(frozen=True)
class Checked:
    """One message of a request, checked: what its service call takes."""

    topic: Topic
    message: sending.OutgoingMessage
    msg_id: str
    is_transaction: bool
    deliver_at: datetime | None


def send(caller: Caller, request: Any) -> Any:
    """The request refused as a whole at its first bad message, with that message's code (as
    RocketMQ's proxy refuses a batch); else every message stored, in one transaction."""
    group = caller.principal.only_group("produce")
    count = len(request.messages)
    try:
        limits.check_count(count, most=limits.MAX_BATCH_MESSAGES, what="messages")
    except limits.LimitError as error:
        raise Refusal(Code.BAD_REQUEST, str(error)) from None
    if count > 1:
        try:
            # Sizes before contents: the batch's bodies in all (a lone message: its body's own
            # limit, as the REST door's single send).
            limits.check_batch_bytes(sum(len(message.body) for message in request.messages))
        except limits.LimitError as error:
            return refused(limit_refusal(error), count)
        try:
            # One topic per request, as RocketMQ's proxy answers (docs/decisions/0076).
            limits.check_batch_topic([message.topic.name for message in request.messages])
        except limits.MixedBatch as error:
            return refused(Refusal(Code.MESSAGE_CORRUPTED, str(error)), count, error.position)
    index: int | None = None
    try:
        epoch = caller.principal.config_epoch
        producer_group = selectors.producer_group_get(name=group, epoch=epoch)
        start = timezone.now()
        checked = []
        for position, message in enumerate(request.messages):
            index = position  # the message a refusal names
            checked.append(checked_message(caller, group, message, start=start))
        index = None
        entries = stored(caller, producer_group, checked)
    except Refusal as refusal:
        return refused(refusal, count, index)
    except BrokerError as error:
        return refused(refusal_of(error, not_found=Code.TOPIC_NOT_FOUND), count, index)
    return rpc.SendMessageResponse(status=status(), entries=entries)


def refused(refusal: Refusal, count: int, index: int | None = None) -> Any:
    """A request refused as a whole: nothing of it was stored, so each message's entry answers
    the refusal (one entry per message, as a lone message's refusal always had); the message at
    fault is named when there are several."""
    text = refusal.message
    if count > 1 and index is not None:
        text = f"Message {index + 1} of {count}: {text}"
    answer = status(refusal.code, text)
    entries = [rpc.SendResultEntry(status=answer) for _ in range(count)]
    return rpc.SendMessageResponse(status=answer, entries=entries)


def stored(caller: Caller, producer_group: ProducerGroup, checked: list[Checked]) -> list[Any]:
    """Every checked message stored by its service. A batch is one transaction, so that a
    later message's conflict (its id in use) leaves no earlier one stored; a lone message
    keeps the services' own single-statement path (docs/decisions/0025)."""
    if len(checked) == 1:
        return [stored_one(caller, producer_group, checked[0])]
    # Stored in (topic, queue, id) order, the order every appending transaction takes its queue
    # rows in (sending.message_send_batch, the delayed delivery scan): two batches crossing the
    # same queues queue up instead of deadlocking. Answered in the order sent.
    order = sorted(range(len(checked)), key=lambda i: lock_place(checked[i]))
    entries: list[Any] = [None] * len(checked)
    with transaction.atomic():
        for i in order:
            entries[i] = stored_one(caller, producer_group, checked[i])
    return entries


def lock_place(item: Checked) -> tuple[int, int, str]:
    queue = sending.queue_for(
        topic=item.topic, msg_id=item.msg_id, message_group=item.message.message_group
    )
    return (item.topic.pk, queue, item.msg_id)


def checked_message(caller: Caller, group: str, message: Any, *, start: datetime) -> Checked:
    """Every limit first (CONTRACT section 3), in the protocol's codes; no service is called."""
    system = message.system_properties
    if system.HasField("lite_topic") and system.lite_topic:
        raise Refusal(Code.UNSUPPORTED, "Lite topics are not supported.")
    if system.HasField("priority"):
        raise Refusal(Code.UNSUPPORTED, "Priority messages are not supported.")
    if system.body_encoding == pb.GZIP:
        raise Refusal(Code.UNSUPPORTED, "Compressed (GZIP) bodies are not supported.")
    # A value this protocol version does not name is refused, never read as the default
    # (docs/decisions/0091).
    enum_name(pb.Encoding, system.body_encoding, code=Code.BAD_REQUEST, what="body encoding")
    kind = enum_name(pb.MessageType, system.message_type, code=Code.BAD_REQUEST, what="type")
    if system.message_type in (pb.LITE, pb.PRIORITY):
        raise Refusal(Code.UNSUPPORTED, f"{kind.capitalize()} messages are not supported.")
    outgoing = outgoing_of(group, message)
    msg_id = system.message_id
    try:
        limits.check_msg_id(msg_id)
    except limits.LimitError as error:
        raise Refusal(Code.ILLEGAL_MESSAGE_ID, str(error)) from None
    is_transaction = system.message_type == pb.TRANSACTION
    deliver_at: datetime | None = None
    if system.HasField("delivery_timestamp"):
        # A transaction's time applies from its commit on, as a REST prepare's deliver_at
        # (docs/decisions/0117).
        deliver_at = delivery_time_of(outgoing, system.delivery_timestamp, start=start)
    epoch = caller.principal.config_epoch
    access.topic_allowed(kind="produce", group=group, topic=message.topic.name, epoch=epoch)
    topic = topic_of(message.topic.name, epoch)
    return Checked(topic, outgoing, msg_id, is_transaction, deliver_at)


def delivery_time_of(
    outgoing: sending.OutgoingMessage, stamp: Any, *, start: datetime
) -> datetime | None:
    """The message's delivery time (services/delivery.delivery_time: within TXHUB_MAX_DELAY),
    from a Timestamp the protocol can hold: any other is ILLEGAL_DELIVERY_TIME too."""
    try:
        return delivery.delivery_time(
            message=outgoing, delay_level=None, deliver_at=to_datetime(stamp), start=start
        )
    except limits.LimitError as error:
        raise Refusal(Code.ILLEGAL_DELIVERY_TIME, str(error)) from None
    except BrokerError as error:
        # A message group with a delivery time: RocketMQ's proxy calls the message DELAY and
        # refuses its type (docs/decisions/0056).
        code = (
            Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
            if "message_group" in error.details
            else Code.ILLEGAL_DELIVERY_TIME
        )
        raise Refusal(code, error.message) from None


def stored_one(caller: Caller, producer_group: ProducerGroup, item: Checked) -> Any:
    if item.is_transaction:
        half = transactions.transaction_prepare(
            producer_group=producer_group,
            topic=item.topic,
            message=item.message,
            actor=Actor(Resolver.PRODUCER, caller.principal.name),
            deliver_at=item.deliver_at,
            msg_id=item.msg_id,
        )
        return rpc.SendResultEntry(
            status=status(), message_id=half.msg_id, transaction_id=str(half.transaction_id)
        )
    sent = sending.message_send(
        topic=item.topic, message=item.message, deliver_at=item.deliver_at, msg_id=item.msg_id
    )
    entry = rpc.SendResultEntry(status=status(), message_id=sent.msg_id)
    if sent.queue_offset is None:  # delayed: recallable until delivered (decision 0055)
        entry.recall_handle = handle_of(
            topic=item.topic.name, deliver_at=sent.deliver_at, msg_id=sent.msg_id
        )
    else:
        entry.offset = sent.queue_offset
    return entry


def outgoing_of(group: str, message: Any) -> sending.OutgoingMessage:
    """The message as the services take it: sizes first, then contents, each in its code."""
    body = bytes(message.body)
    system = message.system_properties
    try:
        limits.check_body_size(body)
    except limits.LimitError as error:
        code = Code.MESSAGE_BODY_TOO_LARGE if error.too_large else Code.MESSAGE_BODY_EMPTY
        raise Refusal(code, str(error)) from None
    tag = system.tag if system.HasField("tag") else ""
    try:
        if tag:
            limits.check_tag(limits.check_text(tag))
    except limits.LimitError as error:
        raise Refusal(Code.ILLEGAL_MESSAGE_TAG, str(error)) from None
    message_group = system.message_group if system.HasField("message_group") else ""
    try:
        if message_group:
            limits.check_message_group(message_group)
    except limits.LimitError as error:
        raise Refusal(Code.ILLEGAL_MESSAGE_GROUP, str(error)) from None
    keys = list(system.keys)
    properties = dict(message.user_properties)
    try:
        limits.check_meta(tags=tag, keys=keys, properties=properties)
    except limits.LimitError as error:
        raise limit_refusal(error, code=Code.MESSAGE_PROPERTIES_TOO_LARGE) from None
    # RocketMQ's proxy's codes: a blank key is ILLEGAL_MESSAGE_KEY, a bad property name
    # ILLEGAL_MESSAGE_PROPERTY_KEY.
    try:
        limits.check_keys(keys)
    except limits.LimitError as error:
        raise Refusal(Code.ILLEGAL_MESSAGE_KEY, str(error)) from None
    try:
        limits.check_properties(properties)
    except limits.LimitError as error:
        raise Refusal(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, str(error)) from None
    # The REST door answers a body in the field it was sent with: UTF-8 text that Postgres
    # text can hold as `body`, anything else as `body_base64`.
    try:
        limits.check_text(body.decode())
        binary = False
    except (UnicodeDecodeError, limits.LimitError):
        binary = True
    return sending.OutgoingMessage(
        producer_group=group,
        body=body,
        body_is_binary=binary,
        tags=tag,
        keys=keys,
        properties=properties,
        message_group=message_group,
    )
