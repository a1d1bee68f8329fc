"""`apache.rocketmq.v2.MessagingService`: each RPC checks the caller and its input, calls one
`apps.broker.services` function (the REST door's), and answers in the protocol's terms."""

import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from django.utils import timezone

from apps.broker import access, limits, selectors
from apps.broker.grpc import streams
from apps.broker.grpc.auth import Caller
from apps.broker.grpc.calls import db, unary
from apps.broker.grpc.consumers import ConsumerRpcs
from apps.broker.grpc.protocol import (
    Code,
    Refusal,
    client_refusal,
    enum_name,
    limit_refusal,
    pb,
    refusal_of,
    rpc,
    rpc_grpc,
    status,
    to_datetime,
)
from apps.broker.grpc.recall import RecallRpcs, handle_of
from apps.broker.grpc.resources import (
    ACCEPTED_TYPES,
    as_caller,
    authenticate,
    broker_of,
    consumer_group_of,
    topic_of,
)
from apps.broker.grpc.unsupported import UnsupportedRpcs
from apps.broker.models import Resolver
from apps.broker.services import (
    checkback_stream,
    clients,
    delivery,
    sending,
    transactions,
)
from apps.broker.services.errors import BrokerError
from apps.broker.services.transactions import Actor


def _heartbeat(caller: Caller, request: Any) -> Any:
    group = ""
    if request.client_type == pb.PRODUCER:
        group = caller.principal.only_group("produce")
    elif request.HasField("group") and request.group.name:
        group = request.group.name
        consumer_group_of(caller, group)
    client_type = enum_name(
        pb.ClientType, request.client_type, code=Code.UNRECOGNIZED_CLIENT_TYPE, what="client type"
    )
    try:
        clients.client_seen(
            client_id=caller.client_id,
            token_id=caller.principal.token_id,
            client_type=client_type,
            group=group,
        )
    except limits.LimitError as error:
        raise client_refusal(error) from None
    return rpc.HeartbeatResponse(status=status())


class MessagingService(
    ConsumerRpcs,
    RecallRpcs,
    UnsupportedRpcs,
    rpc_grpc.MessagingServiceServicer,  # type: ignore[misc]
):
    """Routes, liveness and producers here; consumers in consumers.py; recall in recall.py;
    what txhub does not serve in unsupported.py."""

    def __init__(self, *, process: str) -> None:
        self.process = process

    # Routes and liveness -----------------------------------------------------------------

    @unary(rpc.QueryRouteResponse, not_found=Code.TOPIC_NOT_FOUND)
    async def QueryRoute(self, request: Any, context: Any) -> Any:
        caller = await authenticate(context)
        await db(caller.principal.require_topic, request.topic.name)
        topic = await db(topic_of, request.topic.name)
        broker = broker_of(request.endpoints)
        queues = [
            pb.MessageQueue(
                topic=pb.Resource(
                    name=topic.name, resource_namespace=request.topic.resource_namespace
                ),
                id=queue_id,
                permission=pb.READ_WRITE,
                broker=broker,
                accept_message_types=ACCEPTED_TYPES,
            )
            for queue_id in range(topic.queues)
        ]
        return rpc.QueryRouteResponse(status=status(), message_queues=queues)

    @unary(rpc.HeartbeatResponse, not_found=Code.CONSUMER_GROUP_NOT_FOUND)
    async def Heartbeat(self, request: Any, context: Any) -> Any:
        return await as_caller(context, _heartbeat, request)

    @unary(rpc.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        caller = await authenticate(context)
        try:
            await db(
                clients.client_terminated,
                client_id=caller.client_id,
                token_id=caller.principal.token_id,
            )
        except limits.LimitError as error:
            raise client_refusal(error) from None
        return rpc.NotifyClientTerminationResponse(status=status())

    async def Telemetry(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        try:
            caller = await authenticate(context)
        except Refusal as refusal:
            yield rpc.TelemetryCommand(status=status(refusal.code, refusal.message))
            return
        async for command in streams.serve(
            caller=caller, requests=request_iterator, process=self.process
        ):
            yield command

    # Producers ---------------------------------------------------------------------------

    @unary(rpc.SendMessageResponse, not_found=Code.TOPIC_NOT_FOUND)
    async def SendMessage(self, request: Any, context: Any) -> Any:
        return await as_caller(context, self._send, request)

    def _send(self, caller: Caller, request: Any) -> Any:
        group = caller.principal.only_group("produce")
        try:
            limits.check_count(
                len(request.messages), most=limits.MAX_BATCH_MESSAGES, what="messages"
            )
        except limits.LimitError as error:
            raise Refusal(Code.BAD_REQUEST, str(error)) from None
        entries = []
        for message in request.messages:
            try:
                entries.append(self._send_one(caller, group, message))
            except Refusal as refused:
                entries.append(rpc.SendResultEntry(status=status(refused.code, refused.message)))
            except BrokerError as error:
                mapped = refusal_of(error, not_found=Code.TOPIC_NOT_FOUND)
                entries.append(rpc.SendResultEntry(status=status(mapped.code, mapped.message)))
        first = entries[0].status
        ok = all(entry.status.code == Code.OK for entry in entries)
        overall = (
            first if len(entries) == 1 or ok else status(Code.MULTIPLE_RESULTS, "See entries.")
        )
        return rpc.SendMessageResponse(status=overall, entries=entries)

    def _send_one(self, caller: Caller, group: str, message: Any) -> Any:
        """Every limit first (CONTRACT section 3), then one service call."""
        system = message.system_properties
        if system.HasField("lite_topic") and system.lite_topic:
            raise Refusal(Code.UNSUPPORTED, "Lite topics are not supported.")
        if system.HasField("priority"):
            raise Refusal(Code.UNSUPPORTED, "Priority messages are not supported.")
        if system.body_encoding == pb.GZIP:
            raise Refusal(Code.UNSUPPORTED, "Compressed (GZIP) bodies are not supported.")
        outgoing = self._outgoing(group, message)
        msg_id = system.message_id
        try:
            limits.check_msg_id(msg_id)
        except limits.LimitError as error:
            raise Refusal(Code.ILLEGAL_MESSAGE_ID, str(error)) from None
        is_transaction = system.message_type == pb.TRANSACTION
        deliver_at: datetime | None = None
        if system.HasField("delivery_timestamp"):
            if is_transaction:
                raise Refusal(
                    Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                    "A transactional message has no delivery time.",
                )
            try:
                deliver_at = delivery.delivery_time(
                    message=outgoing,
                    delay_level=None,
                    deliver_at=to_datetime(system.delivery_timestamp),
                    start=timezone.now(),
                )
            except BrokerError as error:
                # A message group with a delivery time: RocketMQ's proxy calls the message DELAY
                # and refuses its type (docs/decisions/0056).
                code = (
                    Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
                    if "message_group" in error.details
                    else Code.ILLEGAL_DELIVERY_TIME
                )
                raise Refusal(code, error.message) from None
        access.topic_allowed(
            kind="produce",
            group=group,
            topic=message.topic.name,
            epoch=caller.principal.config_epoch,
        )
        epoch = caller.principal.config_epoch
        topic = topic_of(message.topic.name, epoch)
        producer_group = selectors.producer_group_get(name=group, epoch=epoch)
        if is_transaction:
            half = transactions.transaction_prepare(
                producer_group=producer_group,
                topic=topic,
                message=outgoing,
                actor=Actor(Resolver.PRODUCER, caller.principal.name),
                msg_id=msg_id,
            )
            return rpc.SendResultEntry(
                status=status(),
                message_id=half.msg_id,
                transaction_id=str(half.transaction_id),
            )
        sent = sending.message_send(
            topic=topic, message=outgoing, deliver_at=deliver_at, msg_id=msg_id
        )
        entry = rpc.SendResultEntry(status=status(), message_id=sent.msg_id)
        if sent.queue_offset is None:  # delayed: recallable until delivered (decision 0055)
            entry.recall_handle = handle_of(
                topic=topic.name, deliver_at=sent.deliver_at, msg_id=sent.msg_id
            )
        else:
            entry.offset = sent.queue_offset
        return entry

    @staticmethod
    def _outgoing(group: str, message: Any) -> sending.OutgoingMessage:
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
            for text in [*keys, *properties.values()]:
                limits.check_text(text)
            for key in properties:
                limits.check_text(key)
        except limits.LimitError as error:
            raise Refusal(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, str(error)) from None
        try:
            limits.check_meta(tags=tag, keys=keys, properties=properties)
        except limits.LimitError as error:
            raise limit_refusal(error, code=Code.MESSAGE_PROPERTIES_TOO_LARGE) from None
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

    @unary(rpc.EndTransactionResponse, not_found=Code.INVALID_TRANSACTION_ID)
    async def EndTransaction(self, request: Any, context: Any) -> Any:
        return await as_caller(context, _end_transaction, request)


def _end_transaction(caller: Caller, request: Any) -> Any:
    try:
        transaction_id = uuid.UUID(request.transaction_id)
    except ValueError:
        raise Refusal(
            Code.INVALID_TRANSACTION_ID, "The transaction id is not one of txhub's."
        ) from None
    if request.resolution not in (pb.COMMIT, pb.ROLLBACK):
        raise Refusal(Code.BAD_REQUEST, "The resolution must be COMMIT or ROLLBACK.")
    commit = request.resolution == pb.COMMIT
    groups = caller.principal.groups("produce")
    if request.source == pb.SOURCE_SERVER_CHECK:
        # Check-back's answer if a check is outstanding to this client, else the producer's.
        checkback_stream.checkback_answer(
            transaction_id=transaction_id,
            answer="COMMIT" if commit else "ROLLBACK",
            client_id=caller.client_id,
            producer=Actor(Resolver.PRODUCER, caller.principal.name),
            producer_groups=groups,
        )
        return rpc.EndTransactionResponse(status=status())
    resolve = transactions.transaction_commit if commit else transactions.transaction_rollback
    resolve(
        transaction_id=transaction_id,
        actor=Actor(Resolver.PRODUCER, caller.principal.name),
        producer_groups=groups,
    )
    return rpc.EndTransactionResponse(status=status())
