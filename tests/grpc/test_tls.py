"""The gRPC door over TLS (TXHUB_GRPC_TLS_CERT / _KEY): a client that trusts the certificate
gets answers; a plaintext client gets none."""

from pathlib import Path
from typing import Any

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from tests.grpc.conftest import GrpcServer, start_grpc, stop
from tests.support.grpc import signed
from tests.support.ports import free_port
from tests.support.tls import self_signed

pytestmark = pytest.mark.e2e


def test_with_a_certificate_the_door_speaks_tls_only(tmp_path: Path, rocketmq_setup: Any) -> None:
    cert, key = self_signed(tmp_path, "127.0.0.1")
    port = free_port()
    with open(tmp_path / "grpc.log", "w") as log:
        process = start_grpc(
            port, log, {"TXHUB_GRPC_TLS_CERT": str(cert), "TXHUB_GRPC_TLS_KEY": str(key)}
        )
        server = GrpcServer(port, process, log)
        try:
            setup = rocketmq_setup("-tls")
            request = rpc.QueryRouteRequest(topic=pb.Resource(name=setup.topic))
            trusted = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
            with grpc.secure_channel(server.endpoint, trusted) as channel:
                answer = MessagingServiceStub(channel).QueryRoute(
                    request, metadata=signed(server, setup, "raw-client"), timeout=10
                )
            assert answer.status.code == pb.Code.OK, answer.status
            assert answer.message_queues
            with grpc.insecure_channel(server.endpoint) as channel, pytest.raises(grpc.RpcError):
                MessagingServiceStub(channel).QueryRoute(
                    request, metadata=signed(server, setup, "raw-client"), timeout=5
                )
        finally:
            stop(process)
