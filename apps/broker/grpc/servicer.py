"""`apache.rocketmq.v2.MessagingService`: each RPC checks the caller and its input, calls one
`apps.broker.services` function (the REST door's), and answers in the protocol's terms."""

import uuid
from collections.abc import AsyncIterator
from typing import Any

from apps.broker import limits
from apps.broker.grpc import producers, streams
from apps.broker.grpc.auth import Caller
from apps.broker.grpc.calls import db, unary
from apps.broker.grpc.consumers import ConsumerRpcs
from apps.broker.grpc.protocol import (
    Code,
    Refusal,
    client_refusal,
    enum_name,
    pb,
    rpc,
    rpc_grpc,
    status,
)
from apps.broker.grpc.recall import RecallRpcs
from apps.broker.grpc.resources import (
    ACCEPTED_TYPES,
    as_caller,
    authenticate,
    broker_of,
    consumer_group_of,
    route_topic,
    topic_of,
)
from apps.broker.grpc.unsupported import UnsupportedRpcs
from apps.broker.models import Resolver
from apps.broker.services import checkback_stream, clients, transactions
from apps.broker.services.transactions import Actor


def _heartbeat(caller: Caller, request: Any) -> Any:
    client_type = enum_name(
        pb.ClientType, request.client_type, code=Code.UNRECOGNIZED_CLIENT_TYPE, what="client type"
    )
    group = ""
    if request.client_type == pb.PRODUCER:
        group = caller.principal.only_group("produce")
    elif client_type.endswith("CONSUMER"):
        # A consumer names its group, as RocketMQ's proxy requires: none is
        # ILLEGAL_CONSUMER_GROUP, never a consumer of no group (docs/decisions/0091).
        group = request.group.name
        consumer_group_of(caller, group)
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
    """Routes, liveness and EndTransaction here; SendMessage in producers.py; consumers in
    consumers.py; recall in recall.py; what txhub does not serve in unsupported.py."""

    def __init__(self, *, process: str) -> None:
        self.process = process

    # Routes and liveness -----------------------------------------------------------------

    @unary(rpc.QueryRouteResponse, not_found=Code.TOPIC_NOT_FOUND)
    async def QueryRoute(self, request: Any, context: Any) -> Any:
        caller = await authenticate(context)
        await db(caller.principal.require_topic, request.topic.name)
        topic = await db(topic_of, request.topic.name)
        broker = broker_of(request.endpoints)
        named = route_topic(topic, request.topic)
        queues = [
            pb.MessageQueue(
                topic=named,
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
        return await as_caller(context, producers.send, request)

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
            token_id=caller.principal.token_id,
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
