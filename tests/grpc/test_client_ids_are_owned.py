"""A RocketMQ client id is scoped to its token (docs/decisions/0034, 0100): another tenant's
token that names it is another client and takes nothing over, and the victim's check-backs reach
the victim. An EndTransaction(SOURCE_SERVER_CHECK) with no check outstanding to the client
is the producer's own resolution. Raw stubs on the real gRPC server; the check is sent by the
check-back service the Celery task runs, through Redis to the server's listener."""

import json
from typing import Any

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import ApiToken, GrpcClient, HalfMessage, OpRecord
from apps.broker.services import checkback, checkback_stream, clients
from tests.e2e.conftest import TEST_BROKER_URL
from tests.grpc.conftest import GrpcServer, Setup
from tests.support import workers
from tests.support.grpc import WAIT, Telemetry, prepare_raw, signed
from tests.support.waiting import wait_until
from txhub.redis_sentinel import broker_client

pytestmark = pytest.mark.e2e

VICTIM_ID = "victim-host@4242@0@producer"
# What the gRPC server logs when a check is not sent on a stream (grpc/checks.py).
REFUSED_LINE = "the stream's token may not receive it"


def prepare(stub: MessagingServiceStub, meta: Any, setup: Setup) -> HalfMessage:
    return prepare_raw(stub, meta, setup, b"the victim's order 9527")


def test_another_token_naming_a_victims_client_id_takes_nothing_and_checks_reach_the_victim(
    grpc_server: GrpcServer,
    rocketmq_setup: Any,
    stub: MessagingServiceStub,
    streams: list[Telemetry],
    settings: Any,
) -> None:
    settings.CELERY_BROKER_URL = TEST_BROKER_URL  # where the gRPC server listens for checks
    victim, intruder = rocketmq_setup("-victim"), rocketmq_setup("-intruder")
    victim_meta = signed(grpc_server, victim, VICTIM_ID)
    stolen_meta = signed(grpc_server, intruder, VICTIM_ID)
    victim_stream = Telemetry(stub, victim_meta)
    streams.append(victim_stream)
    assert victim_stream.settings(victim.topic).status.code == pb.Code.OK

    # The rule changed with decision 0100: the intruder's calls under the victim's id are served
    # as a client of the intruder's own (they were refused FORBIDDEN, which told that the id was
    # in use). What must hold is unchanged: nothing of the victim's client is taken or changed.
    intruder_stream = Telemetry(stub, stolen_meta)
    streams.append(intruder_stream)
    assert intruder_stream.settings(intruder.topic).status.code == pb.Code.OK
    heartbeat = rpc.HeartbeatRequest(client_type=pb.PRODUCER)
    assert stub.Heartbeat(heartbeat, metadata=stolen_meta).status.code == pb.Code.OK
    intruders = GrpcClient.objects.get(client_id=VICTIM_ID, token_id=intruder.token_id)
    assert intruders.group == intruder.producer  # a client of the intruder's own
    goodbye = rpc.NotifyClientTerminationRequest()
    assert stub.NotifyClientTermination(goodbye, metadata=stolen_meta).status.code == pb.Code.OK
    row = GrpcClient.objects.get(client_id=VICTIM_ID, token_id=victim.token_id)
    assert (row.token_id, row.group) == (victim.token_id, victim.producer)
    assert row.stream_process, "the victim's stream is no longer the one held"
    # It said goodbye: its own client's row is gone (decision 0101), the victim's stays.
    assert not GrpcClient.objects.filter(client_id=VICTIM_ID, token_id=intruder.token_id).exists()
    # Positive control: the intruder's token works under a client id of its own.
    own = rpc.HeartbeatRequest(client_type=pb.PRODUCER)
    own_meta = signed(grpc_server, intruder, "intruder-host@1@0@producer")
    assert stub.Heartbeat(own, metadata=own_meta).status.code == pb.Code.OK

    half = prepare(stub, victim_meta, victim)
    assert checkback.checkback_run(half_id=half.pk) == "unknown"  # sent on a stream
    command = victim_stream.next()
    assert command is not None, "the victim's stream ended"
    check = command.recover_orphaned_transaction_command
    assert check.transaction_id == str(half.transaction_id), command
    assert check.message.body == b"the victim's order 9527"
    [sent] = OpRecord.objects.filter(half=half, op="CHECK")
    assert (sent.detail["client_id"], sent.detail["token_id"]) == (VICTIM_ID, victim.token_id)
    assert intruder_stream.incoming.empty(), intruder_stream.incoming.get()

    # The victim answers the check: check-back's resolution.
    end = rpc.EndTransactionRequest(
        topic=pb.Resource(name=victim.topic),
        message_id=half.msg_id,
        transaction_id=str(half.transaction_id),
        resolution=pb.COMMIT,
        source=pb.SOURCE_SERVER_CHECK,
    )
    assert stub.EndTransaction(end, metadata=victim_meta).status.code == pb.Code.OK
    half.refresh_from_db()
    assert (half.state, half.resolved_by) == ("COMMITTED", "CHECK_BACK")


def test_a_server_check_answer_with_no_check_outstanding_is_the_producers_resolution(
    grpc_server: GrpcServer, rocketmq_setup: Any, stub: MessagingServiceStub
) -> None:
    setup = rocketmq_setup("-unasked")
    meta = signed(grpc_server, setup, "unasked-host@7@0@producer")
    half = prepare(stub, meta, setup)
    end = rpc.EndTransactionRequest(
        topic=pb.Resource(name=setup.topic),
        message_id=half.msg_id,
        transaction_id=str(half.transaction_id),
        resolution=pb.ROLLBACK,
        source=pb.SOURCE_SERVER_CHECK,
    )
    assert stub.EndTransaction(end, metadata=meta).status.code == pb.Code.OK
    half.refresh_from_db()
    assert (half.state, half.resolved_by) == ("ROLLED_BACK", "PRODUCER")
    assert not OpRecord.objects.filter(half=half, op="CHECK").exists()


def test_a_check_is_not_sent_on_a_stream_whose_token_lost_the_producer_scope(
    grpc_server: GrpcServer,
    rocketmq_setup: Any,
    stub: MessagingServiceStub,
    streams: list[Telemetry],
    settings: Any,
) -> None:
    settings.CELERY_BROKER_URL = TEST_BROKER_URL
    setup = rocketmq_setup("-narrowed")
    meta = signed(grpc_server, setup, "narrowed-host@1@0@producer")
    stream = Telemetry(stub, meta)
    streams.append(stream)
    assert stream.settings(setup.topic).status.code == pb.Code.OK
    before, after = prepare(stub, meta, setup), prepare(stub, meta, setup)
    # Positive control: while the token holds produce:<group>, the check reaches the stream.
    assert checkback.checkback_run(half_id=before.pk) == "unknown"
    command = stream.next()
    assert command is not None
    assert command.recover_orphaned_transaction_command.transaction_id == str(before.transaction_id)
    # An operator narrows the token (as the admin's save does): the open stream stays, but the
    # next check is not sent on it. The rule changed with decision 0101's addendum: check-back
    # no longer picks the stream (the group has no other producer and no check URL, so the
    # check is unreachable); it used to be handed to the process, which refused it.
    row = GrpcClient.objects.get(token_id=setup.token_id, client_id="narrowed-host@1@0@producer")
    token = ApiToken.objects.get(pk=setup.token_id)
    token.scopes = [f"consume:{setup.consumer}"]
    token.save()
    assert checkback.checkback_run(half_id=after.pk) == "unreachable"
    # A check picked just before the narrowing reaches the process after it: the process reads
    # the token when it forwards the check, and sends nothing on the stream.
    log = workers.log_path("test-grpc.log")
    refusals = log.read_text().count(REFUSED_LINE)
    picked = {"transaction_id": str(after.transaction_id), "client_id": row.client_id}
    with broker_client() as redis:
        channel = checkback_stream.CHANNEL_PREFIX + row.stream_process
        assert redis.publish(channel, json.dumps(picked | {"token_id": row.token_id})) == 1
    assert wait_until(lambda: log.read_text().count(REFUSED_LINE) > refusals, timeout=WAIT)
    assert stream.incoming.empty(), stream.incoming.get()


def test_a_producer_that_says_goodbye_is_no_longer_asked_to_check(
    grpc_server: GrpcServer,
    rocketmq_setup: Any,
    stub: MessagingServiceStub,
    streams: list[Telemetry],
) -> None:
    producer = rocketmq_setup("-leaving")
    client_id = "leaving-host@77@0@producer"
    meta = signed(grpc_server, producer, client_id)
    stream = Telemetry(stub, meta)
    streams.append(stream)
    assert stream.settings(producer.topic).status.code == pb.Code.OK

    def asked() -> list[str]:
        found = clients.producers_with_stream(group=producer.producer, topic=producer.topic)
        return [client.client_id for client in found]

    # The positive control: with its stream open, it is the producer a check-back would ask.
    assert wait_until(asked, timeout=WAIT, interval=0.1) == [client_id]
    goodbye = stub.NotifyClientTermination(rpc.NotifyClientTerminationRequest(), metadata=meta)
    assert goodbye.status.code == pb.Code.OK
    assert asked() == []
    # Its row is deleted, not kept for the sweep (decision 0101): its place is free at once.
    assert not GrpcClient.objects.filter(client_id=client_id).exists()
