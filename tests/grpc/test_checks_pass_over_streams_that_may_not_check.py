"""Check-back asks a producer whose stream may receive the check (services/clients.py,
`producers_with_stream` and `stream_may_check`, docs/decisions/0101): a stream of a token narrowed
since it opened refuses the check when it is forwarded, so picking it first would waste every
round while another producer of the group could answer. Raw stubs on the real gRPC server; the
check goes through Redis to the server's listener, as the Celery task sends it."""

from typing import Any

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import ApiToken, OpRecord
from apps.broker.services import checkback, clients, registry
from tests.e2e.conftest import TEST_BROKER_URL
from tests.grpc.conftest import GrpcServer
from tests.support.grpc import WAIT, Telemetry, prepare_raw, signed
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

KEPT_ID, NARROWED_ID = "kept-host@1@0@producer", "narrowed-host@2@0@producer"


def test_a_check_goes_to_a_producer_that_may_receive_it_not_to_a_narrowed_one_seen_later(
    grpc_server: GrpcServer,
    rocketmq_setup: Any,
    stub: MessagingServiceStub,
    streams: list[Telemetry],
    settings: Any,
) -> None:
    settings.CELERY_BROKER_URL = TEST_BROKER_URL  # where the gRPC server listens for checks
    setup = rocketmq_setup("-two-producers")
    other, _ = registry.token_create(name="second", scopes=[f"produce:{setup.producer}"])
    kept_meta = signed(grpc_server, setup, KEPT_ID)
    narrowed_meta = signed(grpc_server, other, NARROWED_ID)
    kept = Telemetry(stub, kept_meta)
    streams.append(kept)
    assert kept.settings(setup.topic).status.code == pb.Code.OK
    narrowed = Telemetry(stub, narrowed_meta)
    streams.append(narrowed)
    assert narrowed.settings(setup.topic).status.code == pb.Code.OK

    def asked() -> list[str]:
        found = clients.producers_with_stream(group=setup.producer, topic=setup.topic)
        return [client.client_id for client in found]

    # Positive control: while both tokens may produce, the producer seen last is asked first.
    assert wait_until(lambda: asked() == [NARROWED_ID, KEPT_ID], timeout=WAIT, interval=0.1)
    token = ApiToken.objects.get(pk=other.pk)
    token.scopes = [f"consume:{setup.consumer}"]  # as the admin's save narrows it
    token.save()
    assert wait_until(lambda: asked() == [KEPT_ID], timeout=WAIT, interval=0.1)

    half = prepare_raw(stub, kept_meta, setup, b"order 9527")
    assert checkback.checkback_run(half_id=half.pk) == "unknown"  # sent on a stream
    command = kept.next()
    check = command.recover_orphaned_transaction_command
    assert check.transaction_id == str(half.transaction_id), command
    [sent] = OpRecord.objects.filter(half=half, op="CHECK")
    assert (sent.detail["client_id"], sent.detail["token_id"]) == (KEPT_ID, setup.token_id)
    assert narrowed.incoming.empty(), narrowed.incoming.get()
