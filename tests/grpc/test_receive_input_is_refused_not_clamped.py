"""A receive's input at the gRPC door (CONTRACT section 3, invariant 9), on the real server with
raw stubs: a tag filter longer than the REST door takes is ILLEGAL_FILTER_EXPRESSION (it would
become that many query parameters), a batch size outside 1..32 is BAD_REQUEST (0 is proto3's
"unset": the default), a Duration that protobuf calls invalid is refused, and in each case
nothing is received (no delivery row). Each has a positive control: the same receive made good
receives the message."""

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import Delivery, GrpcClient
from tests.grpc.conftest import GrpcServer, Setup
from tests.support.grpc import WAIT, Telemetry, signed

pytestmark = pytest.mark.e2e

# 70,000 tags: past the 65,535 parameters a Postgres query takes.
HUGE_FILTER = " || ".join(f"t{i}" for i in range(70_000))
# Just past MAX_TAG_EXPRESSION_CHARS (4096), every tag in it good.
LONG_FILTER = ("a || " * 820)[:4097]


@pytest.fixture
def door(
    grpc_server: GrpcServer, rocketmq_setup: Callable[..., Setup]
) -> Iterator[tuple[Setup, MessagingServiceStub, Any]]:
    setup = rocketmq_setup()
    with grpc.insecure_channel(grpc_server.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        meta = signed(grpc_server, setup)
        request = rpc.SendMessageRequest()
        item = request.messages.add()
        item.topic.name = setup.topic
        item.body = b"order 9527 created"
        item.system_properties.message_id = "A" * 32
        item.system_properties.message_type = pb.NORMAL
        item.system_properties.tag = "a"
        assert stub.SendMessage(request, metadata=meta).status.code == pb.OK
        yield setup, stub, meta


def receive(setup: Setup, **change: Any) -> Any:
    fields: dict[str, Any] = {
        "group": pb.Resource(name=setup.consumer),
        "message_queue": pb.MessageQueue(topic=pb.Resource(name=setup.topic), id=-1),
        "filter_expression": pb.FilterExpression(type=pb.TAG, expression="a"),
        "batch_size": 32,
        "invisible_duration": Duration(seconds=30),
    }
    fields.update(change)
    return rpc.ReceiveMessageRequest(**fields)


def answers(stub: MessagingServiceStub, request: Any, meta: Any) -> tuple[int, list[bytes]]:
    got = list(stub.ReceiveMessage(request, metadata=meta, timeout=WAIT))
    return got[0].status.code, [a.message.body for a in got if a.HasField("message")]


# (what, the hostile change, the code)
HOSTILE: list[tuple[str, dict[str, Any], int]] = [
    ("a filter of 70,000 tags", {"filter_expression": pb.FilterExpression(
        type=pb.TAG, expression=HUGE_FILTER)}, pb.ILLEGAL_FILTER_EXPRESSION),
    ("a filter of 4,097 characters", {"filter_expression": pb.FilterExpression(
        type=pb.TAG, expression=LONG_FILTER)}, pb.ILLEGAL_FILTER_EXPRESSION),
    ("batch size -5", {"batch_size": -5}, pb.BAD_REQUEST),
    ("batch size 33", {"batch_size": 33}, pb.BAD_REQUEST),
    ("batch size 1000", {"batch_size": 1000}, pb.BAD_REQUEST),
    ("invisible nanos of 2 s", {"invisible_duration": Duration(seconds=10, nanos=2_000_000_000)},
     pb.ILLEGAL_INVISIBLE_TIME),
    ("invisible nanos of the other sign", {"invisible_duration": Duration(
        seconds=20, nanos=-5)}, pb.ILLEGAL_INVISIBLE_TIME),
    ("long-poll nanos of 2 s", {"long_polling_timeout": Duration(
        seconds=1, nanos=2_000_000_000)}, pb.ILLEGAL_POLLING_TIME),
]  # fmt: skip


@pytest.mark.parametrize(("what", "change", "code"), HOSTILE, ids=[row[0] for row in HOSTILE])
def test_a_bad_receive_is_refused_and_receives_nothing(
    door: tuple[Setup, MessagingServiceStub, Any], what: str, change: dict[str, Any], code: int
) -> None:
    setup, stub, meta = door
    status, bodies = answers(stub, receive(setup, **change), meta)
    assert (status, bodies) == (code, []), what
    assert not Delivery.objects.exists()
    # The positive control: the same receive made good receives the message.
    assert answers(stub, receive(setup), meta) == (pb.OK, [b"order 9527 created"])


def test_a_batch_size_of_0_is_unset_and_receives_up_to_the_default(
    door: tuple[Setup, MessagingServiceStub, Any],
) -> None:
    setup, stub, meta = door
    assert answers(stub, receive(setup, batch_size=0), meta) == (pb.OK, [b"order 9527 created"])


def test_a_long_filter_in_telemetry_settings_is_refused_and_not_stored(
    grpc_server: GrpcServer, door: tuple[Setup, MessagingServiceStub, Any]
) -> None:
    setup, stub, _ = door
    client_id = "filtering-consumer"
    stream = Telemetry(stub, signed(grpc_server, setup, client_id))
    try:

        def settings(expression: str) -> Any:
            entry = pb.SubscriptionEntry(
                topic=pb.Resource(name=setup.topic),
                expression=pb.FilterExpression(type=pb.TAG, expression=expression),
            )
            subscription = pb.Subscription(
                group=pb.Resource(name=setup.consumer), subscriptions=[entry]
            )
            command = pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=subscription)
            stream.outgoing.put(rpc.TelemetryCommand(settings=command))
            return stream.next()

        refused = settings(LONG_FILTER)
        assert refused is not None
        assert refused.status.code == pb.ILLEGAL_FILTER_EXPRESSION
        row = GrpcClient.objects.get(client_id=client_id)
        assert (row.client_type, row.topics) == ("UNKNOWN", [])
        accepted = settings("a || b")  # the positive control, on the same stream
        assert accepted is not None
        assert accepted.status.code == pb.OK, accepted
        row.refresh_from_db()
        assert (row.client_type, row.topics) == ("SIMPLE_CONSUMER", [setup.topic])
    finally:
        stream.close()
