"""A RocketMQ client id is scoped to its token (docs/decisions/0100): tenant A naming, first,
the id tenant B's client will use (the official clients make guessable ids, host@pid@counter)
makes a client of A's, and B's client with that id is then served on every call, its own client.
A check-back of B's transaction reaches B's stream, never A's stream of the same id. Raw stubs
on the real gRPC server, signed as the official client signs; the check is sent by the
check-back service through Redis to the server's listener."""

from typing import Any

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import GrpcClient, OpRecord
from apps.broker.services import checkback, clients
from tests.e2e.conftest import TEST_BROKER_URL
from tests.grpc.conftest import GrpcServer, Setup
from tests.support.grpc import WAIT, Telemetry, prepare_raw, signed
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

# The id B's official client would make: A guesses it and uses it first.
GUESSED_ID = "b-host@4242@0@producer"


def test_an_id_another_tenant_took_first_is_still_served_to_b_and_checks_reach_b(
    grpc_server: GrpcServer,
    rocketmq_setup: Any,
    stub: MessagingServiceStub,
    streams: list[Telemetry],
    settings: Any,
) -> None:
    settings.CELERY_BROKER_URL = TEST_BROKER_URL  # where the gRPC server listens for checks
    a, b = rocketmq_setup("-first"), rocketmq_setup("-guessed")
    a_meta, b_meta = signed(grpc_server, a, GUESSED_ID), signed(grpc_server, b, GUESSED_ID)
    beat = rpc.HeartbeatRequest(client_type=pb.PRODUCER)
    # A claims the id before B's client starts, and holds a stream under it.
    assert stub.Heartbeat(beat, metadata=a_meta).status.code == pb.Code.OK
    a_stream = Telemetry(stub, a_meta)
    streams.append(a_stream)
    assert a_stream.settings(a.topic).status.code == pb.Code.OK

    # B's client starts with that id: each of its calls is served.
    assert stub.Heartbeat(beat, metadata=b_meta).status.code == pb.Code.OK
    b_stream = Telemetry(stub, b_meta)
    streams.append(b_stream)
    assert b_stream.settings(b.topic).status.code == pb.Code.OK
    rows = GrpcClient.objects.filter(client_id=GUESSED_ID).order_by("token_id")
    assert [(row.token_id, row.group) for row in rows] == sorted(
        [(a.token_id, a.producer), (b.token_id, b.producer)]
    )

    def asked(setup: Setup) -> list[int | None]:
        found = clients.producers_with_stream(group=setup.producer, topic=setup.topic)
        return [client.token_id for client in found]

    assert wait_until(lambda: asked(b) == [b.token_id], timeout=WAIT, interval=0.1)

    # B's check-back goes to B's stream, not to A's stream of the same id.
    half = prepare_raw(stub, b_meta, b, b"b's order 9527")
    assert checkback.checkback_run(half_id=half.pk) == "unknown"  # sent on a stream
    command = b_stream.next()
    assert command is not None, "B's stream ended"
    check = command.recover_orphaned_transaction_command
    assert check.transaction_id == str(half.transaction_id), command
    [sent] = OpRecord.objects.filter(half=half, op="CHECK")
    assert (sent.detail["client_id"], sent.detail["token_id"]) == (GUESSED_ID, b.token_id)
    assert a_stream.incoming.empty(), a_stream.incoming.get()

    # A's server-check answer under the same id is not check-back's answer to B's check.
    end = rpc.EndTransactionRequest(
        topic=pb.Resource(name=b.topic),
        message_id=half.msg_id,
        transaction_id=str(half.transaction_id),
        resolution=pb.ROLLBACK,
        source=pb.SOURCE_SERVER_CHECK,
    )
    assert stub.EndTransaction(end, metadata=a_meta).status.code == pb.Code.INVALID_TRANSACTION_ID
    end.resolution = pb.COMMIT
    assert stub.EndTransaction(end, metadata=b_meta).status.code == pb.Code.OK
    half.refresh_from_db()
    assert (half.state, half.resolved_by) == ("COMMITTED", "CHECK_BACK")

    # B's goodbye ends B's client only; A's stays where it was.
    goodbye = stub.NotifyClientTermination(rpc.NotifyClientTerminationRequest(), metadata=b_meta)
    assert goodbye.status.code == pb.Code.OK
    assert asked(b) == []
    assert asked(a) == [a.token_id]
