"""FIFO at the gRPC door where the official clients do not go: ordered transactional messages
(the clients refuse a transaction with a message group), the refusals, and the Telemetry
settings a FIFO group's clients get (docs/decisions/0056)."""

import time
import uuid
from typing import Any

import pytest
from rocketmq import Producer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.exception import IllegalArgumentException

from apps.broker.models import CommitLogEntry, HalfMessage
from tests.grpc.conftest import GrpcServer, Setup
from tests.support.grpc import (
    Checker,
    Telemetry,
    config,
    consumer_of,
    message,
    receive_all,
    signed,
    start,
)

pytestmark = pytest.mark.e2e


def send_one(stub: MessagingServiceStub, meta: Any, topic: str, body: bytes, **system: Any) -> Any:
    """One SendMessage as a client would build it; the answer's single entry."""
    request = rpc.SendMessageRequest()
    item = request.messages.add()
    item.topic.name = topic
    item.body = body
    item.system_properties.message_id = uuid.uuid4().hex.upper()
    item.system_properties.message_type = system.pop("message_type", pb.FIFO)
    for name, value in system.items():
        if name == "delivery_timestamp":
            item.system_properties.delivery_timestamp.seconds = value
        else:
            setattr(item.system_properties, name, value)
    answer = stub.SendMessage(request, metadata=meta)
    [entry] = answer.entries
    return entry


def end(stub: MessagingServiceStub, meta: Any, topic: str, entry: Any, resolution: int) -> None:
    request = rpc.EndTransactionRequest(
        topic=pb.Resource(name=topic),
        message_id=entry.message_id,
        transaction_id=entry.transaction_id,
        resolution=resolution,
        source=pb.SOURCE_CLIENT,
    )
    answer = stub.EndTransaction(request, metadata=meta)
    assert answer.status.code == pb.Code.OK, answer.status


def test_ordered_transactions_arrive_in_commit_order(
    grpc_server: GrpcServer,
    rocketmq_setup: Any,
    stub: MessagingServiceStub,
    clients: list[Any],
) -> None:
    """A and B prepared in that order, committed B then A: received B, A. One left PREPARED and
    one rolled back hold nothing up."""
    setup: Setup = rocketmq_setup("-fifo-tx", fifo=True)
    meta = signed(grpc_server, setup, "ordered-tx-client")
    group = "order-9527"

    def prepare(body: bytes) -> Any:
        entry = send_one(
            stub, meta, setup.topic, body, message_type=pb.TRANSACTION, message_group=group
        )
        assert entry.status.code == pb.Code.OK, entry.status
        return entry

    a, b, open_one, rolled_back = (
        prepare(body) for body in (b"A", b"B", b"left open", b"rolled back")
    )
    assert HalfMessage.objects.get(msg_id=a.message_id).message_group == group
    end(stub, meta, setup.topic, rolled_back, pb.ROLLBACK)
    end(stub, meta, setup.topic, b, pb.COMMIT)
    end(stub, meta, setup.topic, a, pb.COMMIT)
    producer = start(clients, Producer(config(grpc_server, setup), (setup.topic,), Checker()))
    after = producer.send(message(setup.topic, b"after both", message_group=group))
    # The official client refuses a transactional message with a group before sending it.
    with pytest.raises(IllegalArgumentException, match="message_group"):
        producer.send(
            message(setup.topic, b"refused", message_group=group), producer.begin_transaction()
        )

    consumer = consumer_of(clients, grpc_server, setup, await_duration=5)
    got = []
    for _ in range(3):  # one at a time: the group's next is not received before the ack
        [item] = receive_all(consumer, 1)
        got.append((item.message_id, item.message_group, item.message_type))
        consumer.ack(item)
    assert got == [
        (b.message_id, group, pb.TRANSACTION),
        (a.message_id, group, pb.TRANSACTION),
        (after.message_id, group, pb.FIFO),
    ]
    assert HalfMessage.objects.get(msg_id=open_one.message_id).state == "PREPARED"
    assert not CommitLogEntry.objects.filter(msg_id=rolled_back.message_id).exists()


def test_a_bad_message_group_or_one_with_a_delivery_time_is_refused(
    grpc_server: GrpcServer, rocketmq_setup: Any, stub: MessagingServiceStub
) -> None:
    setup: Setup = rocketmq_setup("-fifo-bad", fifo=True)
    meta = signed(grpc_server, setup, "bad-group-client")
    refused = {
        "control character": send_one(stub, meta, setup.topic, b"x", message_group="a\x07b"),
        "129 characters": send_one(stub, meta, setup.topic, b"x", message_group="g" * 129),
        "with a delivery time": send_one(
            stub,
            meta,
            setup.topic,
            b"x",
            message_group="order-1",
            message_type=pb.DELAY,
            delivery_timestamp=int(time.time()) + 60,
        ),
    }
    codes = {why: entry.status.code for why, entry in refused.items()}
    assert codes == {
        "control character": pb.Code.ILLEGAL_MESSAGE_GROUP,
        "129 characters": pb.Code.ILLEGAL_MESSAGE_GROUP,
        "with a delivery time": pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
    }, refused
    assert not CommitLogEntry.objects.filter(topic__name=setup.topic).exists()
    ok = send_one(stub, meta, setup.topic, b"x", message_group="g" * 128)
    assert ok.status.code == pb.Code.OK, ok.status


def consumer_settings(stub: MessagingServiceStub, meta: Any, setup: Setup) -> Any:
    telemetry = Telemetry(stub, meta)
    subscription = pb.Subscription(
        group=pb.Resource(name=setup.consumer),
        subscriptions=[
            pb.SubscriptionEntry(
                topic=pb.Resource(name=setup.topic),
                expression=pb.FilterExpression(type=pb.TAG, expression="*"),
            )
        ],
    )
    telemetry.outgoing.put(
        rpc.TelemetryCommand(
            settings=pb.Settings(client_type=pb.PUSH_CONSUMER, subscription=subscription)
        )
    )
    try:
        reply = telemetry.next()
    finally:
        telemetry.close()
    assert reply.status.code == pb.Code.OK, reply.status
    return reply.settings


def test_the_settings_tell_a_fifo_groups_clients_fifo(
    grpc_server: GrpcServer, rocketmq_setup: Any, stub: MessagingServiceStub
) -> None:
    fifo: Setup = rocketmq_setup("-fifo-set", max_delivery_attempts=5, fifo=True)
    normal: Setup = rocketmq_setup("-normal-set")
    ordered = consumer_settings(stub, signed(grpc_server, fifo), fifo)
    assert ordered.subscription.fifo is True
    # The attempts a FIFO client makes in place before it forwards to the dead-letter queue.
    assert ordered.backoff_policy.max_attempts == 5
    assert consumer_settings(stub, signed(grpc_server, normal), normal).subscription.fifo is False
