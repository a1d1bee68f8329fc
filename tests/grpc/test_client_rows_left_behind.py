"""A token keeps a client row only for a client it established and that has not left
(docs/decisions/0101). On a real server with a cap of 4 client ids per token: goodbyes
(NotifyClientTermination) under ids the token never used are answered OK and store nothing, so
they take none of the cap; clients that come (Heartbeat) and say goodbye leave no row behind,
however many there are; revoking the token (DELETE /api/v1/tokens/{id} on the real gunicorn)
deletes its rows at once, closes its open stream, and its group's checks go to a live
producer's stream."""

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import requests
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import ApiToken, GrpcClient, OpRecord
from apps.broker.services import checkback, clients, registry
from tests.conftest import Server
from tests.e2e.conftest import TEST_BROKER_URL
from tests.grpc.conftest import GrpcServer, Setup, own_server
from tests.support.grpc import WAIT, Telemetry, prepare_raw, signed
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

CLIENT_IDS = 4
GOODBYE = rpc.NotifyClientTerminationRequest()
PRODUCER_BEAT = rpc.HeartbeatRequest(client_type=pb.PRODUCER)


@pytest.fixture(scope="module")
def bounded(django_db_setup: None) -> Iterator[GrpcServer]:
    yield from own_server(
        "test-grpc-client-rows.log", {"TXHUB_GRPC_MAX_CLIENTS_PER_TOKEN": str(CLIENT_IDS)}
    )


@pytest.fixture
def stub(bounded: GrpcServer) -> Iterator[MessagingServiceStub]:
    with grpc.insecure_channel(bounded.endpoint) as channel:
        yield MessagingServiceStub(channel)


def rows_of(who: Setup | ApiToken) -> list[str]:
    token_id = who.token_id if isinstance(who, Setup) else who.pk
    found = GrpcClient.objects.filter(token_id=token_id).values_list("client_id", flat=True)
    return sorted(found)


def test_goodbyes_of_clients_a_token_never_had_store_nothing(
    bounded: GrpcServer, rocketmq_setup: Callable[..., Setup], stub: MessagingServiceStub
) -> None:
    setup = rocketmq_setup("-strangers")
    prefix = uuid.uuid4().hex[:6]
    for n in range(3 * CLIENT_IDS):
        meta = signed(bounded, setup, f"made-up-{prefix}-{n}")
        assert stub.NotifyClientTermination(GOODBYE, metadata=meta).status.code == pb.Code.OK
    assert rows_of(setup) == []
    # The positive control: the token's cap is whole, each of its new clients is served.
    ids = sorted(f"real-{prefix}-{n}" for n in range(CLIENT_IDS))
    for client_id in ids:
        meta = signed(bounded, setup, client_id)
        assert stub.Heartbeat(PRODUCER_BEAT, metadata=meta).status.code == pb.Code.OK
    assert rows_of(setup) == ids


def test_clients_that_come_and_say_goodbye_leave_no_rows_behind(
    bounded: GrpcServer, rocketmq_setup: Callable[..., Setup], stub: MessagingServiceStub
) -> None:
    setup = rocketmq_setup("-restarts")
    prefix = uuid.uuid4().hex[:6]
    # A client per process restart: host@pid@counter, a new pid each time.
    for pid in range(3 * CLIENT_IDS):
        meta = signed(bounded, setup, f"host-{prefix}@{pid}@0@producer")
        assert stub.Heartbeat(PRODUCER_BEAT, metadata=meta).status.code == pb.Code.OK
        assert stub.NotifyClientTermination(GOODBYE, metadata=meta).status.code == pb.Code.OK
    assert rows_of(setup) == []


def test_revoking_a_token_forgets_its_clients_and_checks_go_to_a_live_producer(
    bounded: GrpcServer,
    rocketmq_setup: Callable[..., Setup],
    stub: MessagingServiceStub,
    server: Server,
    settings: Any,
) -> None:
    settings.CELERY_BROKER_URL = TEST_BROKER_URL  # where the gRPC server listens for checks
    doomed = rocketmq_setup("-revoked")
    spared = registry.token_create(name="spared", scopes=[f"produce:{doomed.producer}"])[0]
    spared_meta = signed(bounded, spared, "spared-host@1@0@producer")
    spared_stream = Telemetry(stub, spared_meta)
    doomed_stream = Telemetry(stub, signed(bounded, doomed, "doomed-host@1@0@producer"))
    try:
        assert spared_stream.settings(doomed.topic).status.code == pb.Code.OK
        assert doomed_stream.settings(doomed.topic).status.code == pb.Code.OK
        other = signed(bounded, doomed, "doomed-host@2@0@producer")
        assert stub.Heartbeat(PRODUCER_BEAT, metadata=other).status.code == pb.Code.OK
        assert len(rows_of(doomed)) == 2

        def asked() -> list[int | None]:
            found = clients.producers_with_stream(group=doomed.producer, topic=doomed.topic)
            return [client.token_id for client in found]

        # Both producers' streams are open: the one seen last is asked first.
        assert wait_until(lambda: asked() == [doomed.token_id, spared.pk], timeout=WAIT)

        answer = requests.delete(
            server.url(f"/api/v1/tokens/{doomed.token_id}"),
            headers=server.token("admin"),
            timeout=WAIT,
        )
        assert answer.status_code == 204, answer.text
        assert rows_of(doomed) == []
        assert rows_of(spared) == ["spared-host@1@0@producer"]
        assert asked() == [spared.pk]
        last = doomed_stream.next()
        assert last is not None, "the revoked token's stream ended without saying why"
        assert last.status.code == pb.Code.UNAUTHORIZED, last
        assert doomed_stream.next() is None, "the revoked token's stream is still open"
        assert rows_of(doomed) == []  # its stream's clean-up kept nothing either

        # The group's check goes to the live producer's stream.
        half = prepare_raw(stub, spared_meta, doomed, b"order 9527")
        assert checkback.checkback_run(half_id=half.pk) == "unknown"  # sent on a stream
        command = spared_stream.next()
        assert command is not None, "the live producer's stream ended"
        check = command.recover_orphaned_transaction_command
        assert check.transaction_id == str(half.transaction_id), command
        [sent] = OpRecord.objects.filter(half=half, op="CHECK")
        assert sent.detail["token_id"] == spared.pk
    finally:
        doomed_stream.close()
        spared_stream.close()
