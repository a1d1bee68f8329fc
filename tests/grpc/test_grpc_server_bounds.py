"""The gRPC server's own bounds (issue 24, item 4; docs/decisions/0037): past
TXHUB_GRPC_MAX_CONCURRENT_RPCS calls at once a process refuses new ones (RESOURCE_EXHAUSTED)
and serves again once one ends; clients not seen for a day are forgotten."""

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import grpc
import pytest
from django.utils import timezone
from rocketmq import ClientConfiguration, Credentials
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.util.signature import Signature

from apps.broker import tasks
from apps.broker.models import GrpcClient
from apps.broker.services import credentials, registry
from tests.grpc.conftest import start_grpc, stop
from tests.support import workers
from tests.support.ports import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def bounded_endpoint(transactional_db: None) -> Iterator[str]:
    port = free_port()
    with open(workers.log_path("test-grpc-bounded.log"), "w") as log:
        process = start_grpc(port, log, {"TXHUB_GRPC_MAX_CONCURRENT_RPCS": "1"})
        yield f"127.0.0.1:{port}"
        stop(process)


def test_past_the_concurrent_rpc_limit_a_call_is_refused_until_another_ends(
    bounded_endpoint: str,
) -> None:
    """While the one allowed RPC (a Telemetry stream) is open, another call is refused
    RESOURCE_EXHAUSTED; once the stream ends, it is served."""
    registry.topic_create(name="bounded", queues=1)
    registry.producer_group_create(name="bounded-p")
    token = registry.token_create(name="bounded", scopes=["produce:bounded-p"])[0]
    keys = credentials.of(token)
    config = ClientConfiguration(
        bounded_endpoint, Credentials(keys["access_key"], keys["secret_key"])
    )
    meta = Signature.metadata(config, "bounded-client")
    route = rpc.QueryRouteRequest(topic=pb.Resource(name="bounded"))
    done = threading.Event()
    settings = rpc.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER))

    def commands() -> Iterator[Any]:
        yield settings
        done.wait(30)

    with grpc.insecure_channel(bounded_endpoint) as channel:
        stub = MessagingServiceStub(channel)
        assert stub.QueryRoute(route, metadata=meta).status.code == pb.OK  # the control
        stream = stub.Telemetry(commands(), metadata=meta)
        assert next(stream).status.code == pb.OK  # the stream is open: the one RPC allowed
        with pytest.raises(grpc.RpcError) as refused:
            stub.QueryRoute(route, metadata=meta, timeout=5)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        done.set()
        stream.cancel()
        served = wait_until(lambda: _served(stub, route, meta), timeout=10, interval=0.1)
        assert served, "the call was not served after the stream ended"


def _served(stub: Any, route: Any, meta: Any) -> bool:
    try:
        return bool(stub.QueryRoute(route, metadata=meta, timeout=2).status.code == pb.OK)
    except grpc.RpcError:
        return False


def test_clients_not_seen_for_a_day_are_forgotten_by_the_retention_sweep(
    transactional_db: None,
) -> None:
    old = timezone.now() - timedelta(days=1, minutes=1)
    GrpcClient.objects.create(client_id="gone", client_type="PRODUCER", seen_at=old)
    GrpcClient.objects.create(
        client_id="crashed", client_type="PRODUCER", seen_at=old, stream_process="h:1"
    )
    GrpcClient.objects.create(client_id="here", client_type="PRODUCER")
    swept = tasks.retention_sweep()
    assert swept["grpc_clients"] == 2
    assert list(GrpcClient.objects.values_list("client_id", flat=True)) == ["here"]
