"""One token cannot hold every long-lived slot of a gRPC process, nor make client ids without end
(docs/decisions/0084). On a real server with a cap of 2 waits and 2 Telemetry streams per token
and 4 client ids: a token's third stream and third waiting ReceiveMessage at once are refused
TOO_MANY_REQUESTS and store nothing, while another token's stream, wait, route and send are
served; once one of the first token's ends it is served again. A fifth new client id of a token
is refused (BAD_REQUEST, as the other client id limits are: decision 0069) with nothing stored,
even when many are claimed at once, while the token's own ids keep working."""

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import GrpcClient
from tests.grpc.conftest import GrpcServer, Setup, own_server
from tests.support.grpc import Telemetry, raw_message, signed
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

WAITS, STREAMS, CLIENT_IDS = 2, 2, 4
HELD_SECONDS = 6  # how long the first token's waits last: the rest of the test runs meanwhile


@pytest.fixture(scope="module")
def bounded(django_db_setup: None) -> Iterator[GrpcServer]:
    yield from own_server(
        "test-grpc-slots.log",
        {
            "TXHUB_MAX_WAITS_PER_TOKEN": str(WAITS),
            "TXHUB_GRPC_MAX_STREAMS_PER_TOKEN": str(STREAMS),
            "TXHUB_GRPC_MAX_CLIENTS_PER_TOKEN": str(CLIENT_IDS),
            "TXHUB_GRPC_LONG_POLL_MAX": "20",
        },
    )


@pytest.fixture
def stub(bounded: GrpcServer) -> Iterator[MessagingServiceStub]:
    with grpc.insecure_channel(bounded.endpoint) as channel:
        yield MessagingServiceStub(channel)


def open_stream(stub: MessagingServiceStub, meta: Any, topic: str, opened: list[Telemetry]) -> Any:
    """A producer's Telemetry stream with its settings sent: the first command answered."""
    stream = Telemetry(stub, meta)
    opened.append(stream)
    return stream.settings(topic)


def test_a_tokens_streams_past_its_cap_are_refused_while_another_tokens_are_served(
    bounded: GrpcServer,
    rocketmq_setup: Callable[..., Setup],
    stub: MessagingServiceStub,
    streams: list[Telemetry],
) -> None:
    hog, victim = rocketmq_setup("-hog"), rocketmq_setup("-victim")
    held: list[Telemetry] = []
    for n in range(STREAMS):
        answer = open_stream(stub, signed(bounded, hog, f"hog-{n}"), hog.topic, held)
        assert answer.status.code == pb.Code.OK, answer.status
    streams.extend(held)

    refused = open_stream(stub, signed(bounded, hog, "hog-over"), hog.topic, streams)
    assert refused.status.code == pb.Code.TOO_MANY_REQUESTS, refused.status
    assert not GrpcClient.objects.filter(client_id="hog-over").exists()

    # The positive control: the other token's stream and calls are served meanwhile.
    victim_meta = signed(bounded, victim, "victim-0")
    assert open_stream(stub, victim_meta, victim.topic, streams).status.code == pb.Code.OK
    route = rpc.QueryRouteRequest(topic=pb.Resource(name=victim.topic))
    assert stub.QueryRoute(route, metadata=victim_meta).status.code == pb.Code.OK

    held[0].close()  # one of the hog's streams ends: its place is free again

    def reopened() -> bool:
        attempt: list[Telemetry] = []
        answer = open_stream(stub, signed(bounded, hog, "hog-over"), hog.topic, attempt)
        streams.extend(attempt)
        return bool(answer.status.code == pb.Code.OK)

    assert wait_until(reopened, timeout=10, interval=0.2)


def receive_request(setup: Setup, wait: float) -> Any:
    return rpc.ReceiveMessageRequest(
        group=pb.Resource(name=setup.consumer),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=setup.topic), id=-1),
        batch_size=1,
        invisible_duration=Duration(seconds=30),
        long_polling_timeout=Duration(seconds=int(wait)),
    )


def test_a_tokens_waits_past_its_cap_are_refused_while_another_token_waits_and_sends(
    bounded: GrpcServer,
    rocketmq_setup: Callable[..., Setup],
    stub: MessagingServiceStub,
) -> None:
    hog, victim = rocketmq_setup("-hog"), rocketmq_setup("-victim")
    hog_meta, victim_meta = signed(bounded, hog), signed(bounded, victim)

    def receive(setup: Setup, meta: Any, wait: float) -> list[Any]:
        request = receive_request(setup, wait)
        return list(stub.ReceiveMessage(request, metadata=meta, timeout=wait + 10))

    with ThreadPoolExecutor(WAITS + 1) as pool:
        # One wait more than the cap at once: one is refused at once, the others wait.
        waits = [pool.submit(receive, hog, hog_meta, HELD_SECONDS) for _ in range(WAITS + 1)]
        [done] = wait_until(lambda: [f for f in waits if f.done()], timeout=HELD_SECONDS - 2)
        [answer] = done.result()
        assert answer.status.code == pb.Code.TOO_MANY_REQUESTS, answer.status
        assert "TXHUB_MAX_WAITS_PER_TOKEN" in answer.status.message
        held = [f for f in waits if f is not done]

        # The positive control: the other token waits its second, then sends and receives.
        started = time.monotonic()
        [waited] = receive(victim, victim_meta, 1)
        assert waited.status.code == pb.Code.MESSAGE_NOT_FOUND, waited.status
        assert time.monotonic() - started >= 0.9
        sent = stub.SendMessage(
            rpc.SendMessageRequest(messages=[raw_message(victim.topic)]), metadata=victim_meta
        )
        assert sent.status.code == pb.Code.OK, sent.status
        got = receive(victim, victim_meta, 1)
        assert [a.message.body for a in got if a.HasField("message")] == [b"order 9527 created"]
        assert not any(future.done() for future in held), "the hog's waits ended too early"

        for future in held:
            [answer] = future.result(timeout=HELD_SECONDS + 10)
            assert answer.status.code == pb.Code.MESSAGE_NOT_FOUND, answer.status

    started = time.monotonic()
    [again] = receive(hog, hog_meta, 1)
    assert again.status.code == pb.Code.MESSAGE_NOT_FOUND, again.status
    assert time.monotonic() - started >= 0.9, "the wait after the others ended did not wait"


def heartbeat(stub: MessagingServiceStub, bounded: GrpcServer, who: Setup, client_id: str) -> Any:
    request = rpc.HeartbeatRequest(client_type=pb.PRODUCER)
    return stub.Heartbeat(request, metadata=signed(bounded, who, client_id)).status


def test_client_ids_past_a_tokens_cap_are_refused_and_store_nothing(
    bounded: GrpcServer,
    rocketmq_setup: Callable[..., Setup],
    stub: MessagingServiceStub,
) -> None:
    junk, other = rocketmq_setup("-junk"), rocketmq_setup("-other")
    prefix = uuid.uuid4().hex[:6]
    ids = [f"junk-{prefix}-{n}" for n in range(3 * CLIENT_IDS)]
    start = threading.Barrier(len(ids))

    def claim(client_id: str) -> Any:
        start.wait(timeout=20)  # at once: the count must hold against racing claims
        return heartbeat(stub, bounded, junk, client_id)

    with ThreadPoolExecutor(len(ids)) as pool:
        answers = list(pool.map(claim, ids))
    accepted = [i for i, status in zip(ids, answers, strict=True) if status.code == pb.Code.OK]
    refused = [status for status in answers if status.code != pb.Code.OK]
    assert len(accepted) == CLIENT_IDS
    assert {status.code for status in refused} == {pb.Code.BAD_REQUEST}, refused
    assert sorted(
        GrpcClient.objects.filter(token_id=junk.token_id).values_list("client_id", flat=True)
    ) == sorted(accepted)

    # A client id of the token's own is still accepted, on every door that claims one.
    assert heartbeat(stub, bounded, junk, accepted[0]).code == pb.Code.OK
    streams: list[Telemetry] = []
    try:
        answer = open_stream(stub, signed(bounded, junk, accepted[1]), junk.topic, streams)
        assert answer.status.code == pb.Code.OK, answer.status
        over = open_stream(stub, signed(bounded, junk, f"junk-{prefix}-new"), junk.topic, streams)
        assert over.status.code == pb.Code.BAD_REQUEST, over.status
    finally:
        for stream in streams:
            stream.close()
    assert GrpcClient.objects.filter(token_id=junk.token_id).count() == CLIENT_IDS
    # The cap is per token: another token's new ids are served.
    assert heartbeat(stub, bounded, other, f"other-{prefix}").code == pb.Code.OK
