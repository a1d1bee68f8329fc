"""Request bytes that are not the RPC's protobuf message (corrupt, cut off, a string field of
invalid UTF-8), sent raw over a grpcio channel to every RPC of the protocol's service
descriptor: each is answered with its response type carrying BAD_REQUEST and a plain sentence
(never grpcio's bare UNKNOWN naming a Python class), and stores nothing; a valid request is
still answered by its handler. docs/decisions/0097."""

import queue
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message_factory import GetMessageClass
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from apps.broker.models import CommitLogEntry, GrpcClient, HalfMessage
from apps.broker.services import registry
from tests.grpc.conftest import GrpcServer
from tests.support.grpc import raw_message, signed

pytestmark = pytest.mark.e2e

SERVICE = rpc.DESCRIPTOR.services_by_name["MessagingService"]
WAIT = 20  # seconds an answer may take (a bound, not a measurement)


def varint(value: int) -> bytes:
    out = b""
    while value >= 0x80:
        out += bytes([value & 0x7F | 0x80])
        value >>= 7
    return out + bytes([value])


def with_string(descriptor: Descriptor, value: bytes) -> bytes:
    """The wire bytes of a message of `descriptor` whose first string field reachable through
    its message fields holds `value`, bytes as they are (UTF-8 or not)."""
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_STRING:
            inner = value
        elif (
            field.type == FieldDescriptor.TYPE_MESSAGE
            and not field.message_type.GetOptions().map_entry
        ):
            inner = with_string(field.message_type, value)
            if not inner:
                continue
        else:
            continue
        return varint(field.number << 3 | 2) + varint(len(inner)) + inner
    return b""


def undecodable(method: MethodDescriptor) -> dict[str, bytes]:
    return {
        "corrupt": b"\xff\xff\xff\xff",
        "cut off": with_string(method.input_type, b"abc")[:-1],
        "invalid UTF-8": with_string(method.input_type, b"a\xff\xfeb"),
    }


def stored() -> tuple[int, int, int]:
    return HalfMessage.objects.count(), CommitLogEntry.objects.count(), GrpcClient.objects.count()


def answers(channel: Any, method: MethodDescriptor, data: bytes, meta: Any) -> list[Any]:
    """The answers of a unary or server-streaming RPC to `data`, sent as they are."""
    path = f"/{SERVICE.full_name}/{method.name}"
    response = GetMessageClass(method.output_type).FromString
    if method.server_streaming:
        call = channel.unary_stream(path, request_serializer=None, response_deserializer=response)
        return list(call(data, metadata=meta, timeout=WAIT))
    call = channel.unary_unary(path, request_serializer=None, response_deserializer=response)
    return [call(data, metadata=meta, timeout=WAIT)]


def refused_plainly(answer: Any, method: MethodDescriptor) -> bool:
    sentence = f"The request is not a valid {method.input_type.name} message."
    return bool(answer.status.code == pb.BAD_REQUEST and answer.status.message == sentence)


@pytest.fixture
def channel(grpc_server: GrpcServer) -> Iterator[Any]:
    with grpc.insecure_channel(grpc_server.endpoint) as opened:
        yield opened


def test_every_rpc_answers_undecodable_bytes_with_bad_request_and_stores_nothing(
    grpc_server: GrpcServer, door: Any, channel: Any
) -> None:
    setup, _, meta = door
    unary = [m for m in SERVICE.methods if not m.client_streaming]
    assert len(unary) == len(SERVICE.methods) - 1  # all but Telemetry, tested below
    wrong: list[str] = []
    for method in unary:
        for what, data in undecodable(method).items():
            assert data, (method.name, what)
            before = stored()
            try:
                got = answers(channel, method, data, meta)
            except grpc.RpcError as error:
                wrong.append(f"{method.name} ({what}): gRPC {error.code()}: {error.details()}")
                continue
            if len(got) != 1 or not refused_plainly(got[0], method):
                wrong.append(f"{method.name} ({what}): {[a.status for a in got]}")
            elif stored() != before:
                wrong.append(f"{method.name} ({what}): stored")
    assert not wrong, "\n".join(wrong)
    # Before the caller is checked: unsigned bytes get the same answer.
    send = SERVICE.methods_by_name["SendMessage"]
    assert refused_plainly(answers(channel, send, b"\xff\xff", [])[0], send)
    # Positive controls: every RPC's handler still answers a valid (empty) request in the
    # protocol's terms, and a good message is stored.
    for method in unary:
        for answer in answers(channel, method, b"", meta):
            assert not refused_plainly(answer, method), method.name
    before = stored()
    good = rpc.SendMessageRequest(messages=[raw_message(setup.topic)]).SerializeToString()
    (sent,) = answers(channel, send, good, meta)
    assert sent.status.code == pb.OK, sent.status
    assert stored() == (before[0], before[1] + 1, before[2])


def test_a_telemetry_stream_answers_an_undecodable_command_last_with_bad_request(
    grpc_server: GrpcServer, door: Any, channel: Any
) -> None:
    """A command that is not a TelemetryCommand ends the client's commands: what the stream
    owed is answered, then a BAD_REQUEST command, and the stream ends (the client reopens it)."""
    setup, _, _ = door
    token = registry.token_create(name="telemetry", scopes=[f"produce:{setup.producer}"])[0]
    method = SERVICE.methods_by_name["Telemetry"]
    settings = rpc.TelemetryCommand(
        settings=pb.Settings(
            client_type=pb.PRODUCER,
            publishing=pb.Publishing(topics=[pb.Resource(name=setup.topic)]),
        )
    ).SerializeToString()
    open_stream = channel.stream_stream(
        f"/{SERVICE.full_name}/Telemetry",
        request_serializer=None,
        response_deserializer=rpc.TelemetryCommand.FromString,
    )
    for what, data in undecodable(method).items():
        outgoing: queue.Queue[bytes | None] = queue.Queue()
        outgoing.put(settings)
        call = open_stream(
            iter(outgoing.get, None), metadata=signed(grpc_server, token), timeout=WAIT
        )
        replies = iter(call)
        try:
            first = next(replies)
            assert first.status.code == pb.OK, (what, first)
            assert first.HasField("settings"), (what, first)
            before = stored()
            outgoing.put(data)  # the stream stays open on the client's side
            rest = list(replies)
        except grpc.RpcError as error:
            pytest.fail(f"Telemetry ({what}): gRPC {error.code()}: {error.details()}")
        finally:
            outgoing.put(None)
        assert len(rest) == 1, (what, rest)
        assert refused_plainly(rest[0], method), (what, rest)
        assert stored() == before, what
