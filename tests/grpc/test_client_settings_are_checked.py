"""What a RocketMQ client says about itself (its client id, Heartbeat, Telemetry settings) is
checked before its row is written (services/clients.py, limits.check_client_id/check_client), on
the real server with raw stubs: no client id (or a blank one) is CLIENT_ID_REQUIRED and claims
nothing (not "" for every token), a client id too long for its row is refused, never cut; an
unknown client type is UNRECOGNIZED_CLIENT_TYPE, a bad topic ILLEGAL_TOPIC, other junk
BAD_REQUEST, each as a status (in the Heartbeat answer, or on the stream, which stays open), and
nothing is stored. The
x-mq-language and x-mq-client-version headers are held to the settings' widths on every call,
never cut. Each has a positive control: the good call is answered OK and stored."""

from collections.abc import Callable
from typing import Any

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker import limits
from apps.broker.models import CommitLogEntry, GrpcClient
from tests.grpc.conftest import GrpcServer, Setup
from tests.support.grpc import Telemetry, raw_message, signed

pytestmark = pytest.mark.e2e


def without_client_id(meta: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A signed call that names no client id (the signature covers x-mq-date-time only)."""
    return [(key, value) for key, value in meta if key != "x-mq-client-id"]


def producer_heartbeat(stub: MessagingServiceStub, meta: Any) -> int:
    request = rpc.HeartbeatRequest(client_type=pb.PRODUCER)
    return int(stub.Heartbeat(request, metadata=meta).status.code)


def test_calls_without_a_client_id_or_with_a_blank_one_are_refused_and_claim_nothing(
    grpc_server: GrpcServer,
    rocketmq_setup: Callable[..., Setup],
    stub: MessagingServiceStub,
    streams: list[Telemetry],
) -> None:
    first, second = rocketmq_setup("-first"), rocketmq_setup("-second")
    for setup in (first, second):
        # A blank id would be one id shared by every client that sends it (decision 0107).
        for meta in (
            without_client_id(signed(grpc_server, setup)),
            signed(grpc_server, setup, "  "),
        ):
            assert producer_heartbeat(stub, meta) == pb.CLIENT_ID_REQUIRED
            request = rpc.NotifyClientTerminationRequest()
            goodbye = stub.NotifyClientTermination(request, metadata=meta)
            assert goodbye.status.code == pb.CLIENT_ID_REQUIRED
            stream = Telemetry(stub, meta)
            streams.append(stream)
            assert stream.next().status.code == pb.CLIENT_ID_REQUIRED
            assert stream.next() is None
    assert not GrpcClient.objects.exists()
    # The positive control: with a client id, the heartbeat is answered and remembered.
    assert producer_heartbeat(stub, signed(grpc_server, first, "host@1@0@producer")) == pb.OK
    assert list(GrpcClient.objects.values_list("client_id", flat=True)) == ["host@1@0@producer"]


def test_a_client_id_too_long_for_its_row_is_refused_never_cut(
    grpc_server: GrpcServer,
    rocketmq_setup: Callable[..., Setup],
    stub: MessagingServiceStub,
    streams: list[Telemetry],
) -> None:
    first, second = rocketmq_setup("-first"), rocketmq_setup("-second")
    # Two ids that cutting at 255 characters would make one.
    long_ids = ["h" * 255 + "-first", "h" * 255 + "-second"]
    for setup, client_id in zip((first, second), long_ids, strict=True):
        meta = signed(grpc_server, setup, client_id)
        assert producer_heartbeat(stub, meta) == pb.BAD_REQUEST
        goodbye = stub.NotifyClientTermination(rpc.NotifyClientTerminationRequest(), metadata=meta)
        assert goodbye.status.code == pb.BAD_REQUEST
        stream = Telemetry(stub, meta)
        streams.append(stream)
        assert stream.next().status.code == pb.BAD_REQUEST
    assert not GrpcClient.objects.exists()
    # The positive control: 255 characters fit, for each token its own.
    assert producer_heartbeat(stub, signed(grpc_server, first, "h" * 255)) == pb.OK
    assert producer_heartbeat(stub, signed(grpc_server, second, "g" * 255)) == pb.OK
    assert GrpcClient.objects.count() == 2


@pytest.mark.parametrize(
    ("client_type", "code"),
    [(99, pb.UNRECOGNIZED_CLIENT_TYPE), (pb.CLIENT_TYPE_UNSPECIFIED, pb.UNRECOGNIZED_CLIENT_TYPE)],
)
def test_a_heartbeat_of_an_unknown_client_type_is_refused_and_not_stored(
    grpc_server: GrpcServer,
    rocketmq_setup: Callable[..., Setup],
    stub: MessagingServiceStub,
    client_type: int,
    code: int,
) -> None:
    setup = rocketmq_setup()
    meta = signed(grpc_server, setup, "host@1@0@producer")
    request = rpc.HeartbeatRequest(client_type=client_type)
    assert stub.Heartbeat(request, metadata=meta).status.code == code
    assert not GrpcClient.objects.exists()
    assert producer_heartbeat(stub, meta) == pb.OK  # the positive control
    assert GrpcClient.objects.get().client_type == "PRODUCER"


def producer_settings(topics: list[str], **change: Any) -> Any:
    agent = {"language": pb.PYTHON, "version": "5.1.0", "hostname": "shop-1"}
    agent.update(change.pop("agent", {}))
    settings = pb.Settings(
        client_type=change.pop("client_type", pb.PRODUCER),
        publishing=pb.Publishing(topics=[pb.Resource(name=topic) for topic in topics]),
        user_agent=pb.UA(**agent),
    )
    return rpc.TelemetryCommand(settings=settings)


# (what, the hostile change, the code)
HOSTILE: list[tuple[str, dict[str, Any], int]] = [
    ("an unknown client type", {"client_type": 99}, pb.UNRECOGNIZED_CLIENT_TYPE),
    ("an unknown language", {"agent": {"language": 99}}, pb.BAD_REQUEST),
    ("a hostname of 256 characters", {"agent": {"hostname": "h" * 256}}, pb.BAD_REQUEST),
    ("a NUL in the hostname", {"agent": {"hostname": "shop\x00"}}, pb.BAD_REQUEST),
    ("a version of 65 characters", {"agent": {"version": "1" * 65}}, pb.BAD_REQUEST),
    ("a NUL in a topic", {"topics": ["orders\x00"]}, pb.ILLEGAL_TOPIC),
    ("1,001 topics", {"topics": [f"t{i}" for i in range(1001)]}, pb.ILLEGAL_TOPIC),
]


@pytest.mark.parametrize(("what", "change", "code"), HOSTILE, ids=[row[0] for row in HOSTILE])
def test_junk_in_telemetry_settings_is_answered_with_a_status_and_not_stored(
    grpc_server: GrpcServer,
    rocketmq_setup: Callable[..., Setup],
    stub: MessagingServiceStub,
    streams: list[Telemetry],
    what: str,
    change: dict[str, Any],
    code: int,
) -> None:
    setup = rocketmq_setup()
    client_id = "host@1@0@producer"
    stream = Telemetry(stub, signed(grpc_server, setup, client_id))
    streams.append(stream)
    topics = change.pop("topics", [setup.topic])
    stream.outgoing.put(producer_settings(topics, **change))
    refused = stream.next()
    assert refused is not None, f"{what}: the stream ended without a status"
    assert refused.status.code == code, (what, refused.status)
    row = GrpcClient.objects.get(client_id=client_id)
    assert (row.client_type, row.topics, row.hostname, row.version) == ("UNKNOWN", [], "", "")
    # The positive control, on the same stream: good settings are answered and stored.
    stream.outgoing.put(producer_settings([setup.topic]))
    accepted = stream.next()
    assert accepted is not None
    assert accepted.status.code == pb.OK, accepted
    row.refresh_from_db()
    assert (row.client_type, row.topics, row.hostname, row.language) == (
        "PRODUCER",
        [setup.topic],
        "shop-1",
        "PYTHON",
    )


def with_header(meta: list[tuple[str, str]], name: str, value: str) -> list[tuple[str, str]]:
    """Signed metadata with one header's value replaced (the signature covers x-mq-date-time
    only)."""
    return [(key, value if key == name else given) for key, given in meta]


# The headers that describe a client, their widths and their one character too many.
HEADERS = [
    ("x-mq-client-version", "version", limits.MAX_CLIENT_VERSION_CHARS),
    ("x-mq-language", "language", limits.MAX_CLIENT_LANGUAGE_CHARS),
]


@pytest.mark.parametrize(("header", "field", "most"), HEADERS, ids=[h[1] for h in HEADERS])
def test_an_over_long_client_header_is_refused_as_the_settings_are(
    grpc_server: GrpcServer,
    rocketmq_setup: Callable[..., Setup],
    stub: MessagingServiceStub,
    streams: list[Telemetry],
    header: str,
    field: str,
    most: int,
) -> None:
    """x-mq-language and x-mq-client-version are checked by the settings' rule on every call
    (limits.check_client_texts, decision 0076), never cut: BAD_REQUEST with the settings'
    sentence, nothing stored. The positive controls: the official Python client's own values
    and values of exactly the width."""
    setup = rocketmq_setup()
    client_id = "host@1@0@producer"
    official = signed(grpc_server, setup, client_id)
    assert dict(official)[header] in {"PYTHON", "5.1.2"}  # what the client sends
    # The settings' answer to a value one character too long, where the settings carry it.
    sentence = f"A client's {field} has at most {most} characters."
    if field == "version":
        stream = Telemetry(stub, signed(grpc_server, setup, "host@2@0@producer"))
        streams.append(stream)
        stream.outgoing.put(producer_settings([setup.topic], agent={"version": "1" * (most + 1)}))
        answer = stream.next()
        assert answer is not None
        assert (answer.status.code, answer.status.message) == (pb.BAD_REQUEST, sentence)
    meta = with_header(signed(grpc_server, setup, client_id), header, "1" * (most + 1))
    send = rpc.SendMessageRequest(messages=[raw_message(setup.topic)])
    answers = [
        stub.Heartbeat(rpc.HeartbeatRequest(client_type=pb.PRODUCER), metadata=meta).status,
        stub.SendMessage(send, metadata=meta).status,
        stub.QueryRoute(
            rpc.QueryRouteRequest(topic=pb.Resource(name=setup.topic)), metadata=meta
        ).status,
    ]
    assert [(a.code, a.message) for a in answers] == [(pb.BAD_REQUEST, sentence)] * 3
    stream = Telemetry(stub, meta)
    streams.append(stream)
    refused = stream.next()
    assert refused is not None
    assert (refused.status.code, refused.status.message) == (pb.BAD_REQUEST, sentence)
    assert stream.next() is None
    assert not GrpcClient.objects.filter(client_id=client_id).exists()
    assert not CommitLogEntry.objects.exists()
    # The positive controls: the official client's values, and values of exactly the width.
    for good in (official, with_header(official, header, "1" * most)):
        heartbeat = rpc.HeartbeatRequest(client_type=pb.PRODUCER)
        assert stub.Heartbeat(heartbeat, metadata=good).status.code == pb.OK
        assert stub.SendMessage(send, metadata=good).status.code == pb.OK
    assert CommitLogEntry.objects.count() == 1  # the same message id, sent twice
