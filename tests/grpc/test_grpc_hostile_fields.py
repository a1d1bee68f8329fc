"""Hostile input at the gRPC door by class, generated from the protocol's own descriptors: for
every unary and server-streaming RPC txhub serves, every field of its request (nested ones
too) gets a hostile value of its kind: a string with a NUL, one of 70,000 characters, an enum
value the protocol does not name, a message left out. The answer is the protocol's status
(never a bare gRPC error, never INTERNAL_ERROR), a refusal stores nothing, and a field txhub
reads refuses the value. Fields txhub never reads are listed with why. docs/decisions/0091."""

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from apps.broker.models import CommitLogEntry, GrpcClient, HalfMessage
from apps.broker.services import registry
from tests.grpc.conftest import GrpcServer
from tests.support.grpc import raw_message, signed

pytestmark = pytest.mark.e2e

SERVICE = rpc.DESCRIPTOR.services_by_name["MessagingService"]


def requests(topic: str, group: str) -> dict[str, Any]:
    """A request of each RPC that txhub serves, good but for what a test changes in it."""
    t, g = pb.Resource(name=topic), pb.Resource(name=group)
    address = pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=8081)])
    return {
        "QueryRoute": rpc.QueryRouteRequest(topic=t, endpoints=address),
        "Heartbeat": rpc.HeartbeatRequest(group=g, client_type=pb.SIMPLE_CONSUMER),
        "SendMessage": rpc.SendMessageRequest(messages=[raw_message(topic)]),
        "QueryAssignment": rpc.QueryAssignmentRequest(topic=t, group=g, endpoints=address),
        "ReceiveMessage": rpc.ReceiveMessageRequest(
            group=g, message_queue=pb.MessageQueue(topic=t, id=-1), batch_size=1
        ),
        "AckMessage": rpc.AckMessageRequest(
            group=g, topic=t, entries=[rpc.AckMessageEntry(message_id="AB", receipt_handle="x")]
        ),
        "ForwardMessageToDeadLetterQueue": rpc.ForwardMessageToDeadLetterQueueRequest(
            group=g, topic=t, receipt_handle="x", message_id="AB"
        ),
        "EndTransaction": rpc.EndTransactionRequest(
            topic=t, message_id="AB", transaction_id="x", resolution=pb.COMMIT
        ),
        "NotifyClientTermination": rpc.NotifyClientTerminationRequest(group=g),
        "ChangeInvisibleDuration": rpc.ChangeInvisibleDurationRequest(
            group=g, topic=t, receipt_handle="x"
        ),
        "RecallMessage": rpc.RecallMessageRequest(topic=t, recall_handle="x"),
    }


# Fields txhub does not read, by the last part of their path or the whole of it: the system
# properties the broker sets itself (a producer's are ignored, as RocketMQ's proxy ignores
# them), the digest (the transport's checksum guards the body), names the request carries for
# the client's bookkeeping (message ids and topics beside a receipt handle, which alone says
# what is meant), the group of a termination (the client id says whose it is) and the
# namespaces of resources that no answer echoes (txhub has no namespaces, decision 0076).
NOT_READ = {
    "born_host", "store_host", "trace_context", "born_timestamp", "store_timestamp", "queue_id",
    "queue_offset", "delivery_attempt", "orphaned_transaction_recovery_duration",
    "dead_letter_queue", "body_digest", "resource_namespace",
}  # fmt: skip
NOT_READ_PATHS = {
    "SendMessage": {"messages.system_properties.receipt_handle",
                    "messages.system_properties.invisible_duration"},
    "AckMessage": {"topic", "entries.message_id"},
    "ForwardMessageToDeadLetterQueue": {"message_id", "delivery_attempt",
                                        "max_delivery_attempts"},
    "ChangeInvisibleDuration": {"topic", "message_id"},
    "EndTransaction": {"topic", "message_id", "trace_context"},
    "NotifyClientTermination": {"group"},
    "ReceiveMessage": {"message_queue.id", "message_queue.permission",
                       "message_queue.broker", "message_queue.accept_message_types",
                       "auto_renew", "attempt_id"},
}  # fmt: skip
# Messages whose absence means a default: the access point the server is configured with, an
# immediate delivery, the default invisible time, no long poll, every tag.
OPTIONAL = {"endpoints", "delivery_timestamp", "invisible_duration", "long_polling_timeout",
            "filter_expression"}  # fmt: skip
# Namespaces echoed in an answer, which are read (decision 0091).
READ_NAMESPACES = {"QueryRoute": "topic", "QueryAssignment": "topic"}


def fields(descriptor: Descriptor, prefix: tuple[FieldDescriptor, ...] = ()) -> Iterator[Any]:
    for field in descriptor.fields:
        path = (*prefix, field)
        yield path
        message = field.message_type
        if message is not None and not message.GetOptions().map_entry and len(path) < 4:
            yield from fields(message, path)


def holder(request: Any, path: tuple[FieldDescriptor, ...]) -> Any:
    """The message that holds the path's last field (the first entry of a repeated one)."""
    for field in path[:-1]:
        value = getattr(request, field.name)
        if field.is_repeated:
            value = value[0] if len(value) else value.add()
        request = value
    return request


Change = Callable[[Any], None]


def hostile_values(field: FieldDescriptor) -> Iterator[tuple[str, Change]]:
    def set_to(value: Any) -> Change:
        return lambda message: setattr(message, field.name, value)

    if field.is_repeated:
        return
    if field.type == FieldDescriptor.TYPE_STRING:
        yield "NUL", set_to("a\x00b")
        yield "70000 characters", set_to("x" * 70000)
    elif field.type == FieldDescriptor.TYPE_ENUM:
        yield "an unnamed enum value", set_to(999)
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        yield "missing", lambda message: message.ClearField(field.name)


def read(rpc_name: str, path: tuple[FieldDescriptor, ...]) -> bool:
    dotted = ".".join(field.name for field in path)
    if dotted in NOT_READ_PATHS.get(rpc_name, set()) or any(
        dotted.startswith(p + ".") for p in NOT_READ_PATHS.get(rpc_name, set())
    ):
        return False
    if path[-1].name in OPTIONAL:
        return False
    if path[-1].name == "resource_namespace":
        return READ_NAMESPACES.get(rpc_name) == dotted.rsplit(".", 1)[0]
    return not any(field.name in NOT_READ for field in path)


def stored() -> tuple[int, int, int]:
    return HalfMessage.objects.count(), CommitLogEntry.objects.count(), GrpcClient.objects.count()


def answer_of(stub: Any, rpc_name: str, request: Any, meta: Any) -> str:
    """The status code's name, or the bare gRPC error's."""
    try:
        answer = getattr(stub, rpc_name)(request, metadata=meta, timeout=20)
        if SERVICE.methods_by_name[rpc_name].server_streaming:
            answer = next(iter(answer))
        return str(pb.Code.Name(answer.status.code))
    except grpc.RpcError as error:
        return f"gRPC {error.code()}: {error.details()}"


def test_every_field_of_every_rpc_refuses_hostile_values_and_stores_nothing(
    grpc_server: GrpcServer, door: Any
) -> None:
    setup, stub, _ = door
    token = registry.token_create(
        name="both", scopes=[f"produce:{setup.producer}", f"consume:{setup.consumer}"]
    )[0]
    meta = signed(grpc_server, token)
    assert answer_of(stub, "Heartbeat", requests(setup.topic, setup.consumer)["Heartbeat"], meta)
    wrong: list[str] = []
    for rpc_name, good in requests(setup.topic, setup.consumer).items():
        for path in fields(SERVICE.methods_by_name[rpc_name].input_type):
            for what, change in hostile_values(path[-1]):
                request = type(good)()
                request.CopyFrom(good)
                change(holder(request, path))
                before = stored()
                code = answer_of(stub, rpc_name, request, meta)
                where = f"{rpc_name} {'.'.join(f.name for f in path)} ({what}): {code}"
                if code.startswith("gRPC") or code == "INTERNAL_ERROR":
                    wrong.append(where)
                elif code != "OK" and stored() != before:
                    wrong.append(where + ", stored")
                elif code == "OK" and read(rpc_name, path):
                    wrong.append(where + ", accepted")
    assert not wrong, "\n".join(wrong)
    # The positive control: each good request is answered (OK or its own not-found code).
    for rpc_name, good in requests(setup.topic, setup.consumer).items():
        assert not answer_of(stub, rpc_name, good, meta).startswith("gRPC"), rpc_name


def test_a_route_echoes_a_bounded_access_point_and_namespace(
    grpc_server: GrpcServer, door: Any
) -> None:
    """The routes echo the client's endpoints and namespace for every queue: 3.6 MB of addresses
    on a 256-queue topic was a 920 MB answer built in memory (and then not sent)."""
    setup, stub, meta = door
    registry.topic_create(name="wide", queues=256)
    token = registry.token_create(name="wide", scopes=[f"produce:{setup.producer}"])[0]
    meta = signed(grpc_server, token)
    many = [pb.Address(host="h" * 30, port=8081) for _ in range(100_000)]
    hostile = {
        "100,000 addresses": (
            rpc.QueryRouteRequest(
                topic=pb.Resource(name="wide"),
                endpoints=pb.Endpoints(scheme=pb.IPv4, addresses=many),
            ),
            "ILLEGAL_ACCESS_POINT",
        ),
        "a namespace of 4,000,000 characters": (
            rpc.QueryRouteRequest(
                topic=pb.Resource(name="wide", resource_namespace="n" * 4_000_000)
            ),
            "ILLEGAL_TOPIC",
        ),
    }
    for what, (request, code) in hostile.items():
        started = time.monotonic()
        assert answer_of(stub, "QueryRoute", request, meta) == code, what
        assert time.monotonic() - started < 5, what
    good = rpc.QueryRouteRequest(
        topic=pb.Resource(name="wide", resource_namespace="MQ_INST_1"),
        endpoints=pb.Endpoints(
            scheme=pb.DOMAIN_NAME, addresses=[pb.Address(host="mq.example.com", port=8081)]
        ),
    )
    answer = stub.QueryRoute(good, metadata=meta)
    assert answer.status.code == pb.OK, answer.status
    assert len(answer.message_queues) == 256
    queue = answer.message_queues[0]
    assert queue.topic.resource_namespace == "MQ_INST_1"
    assert queue.broker.endpoints.addresses[0].host == "mq.example.com"
