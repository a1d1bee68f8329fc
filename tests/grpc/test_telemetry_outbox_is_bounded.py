"""A Telemetry stream's outbox is bounded (TXHUB_GRPC_STREAM_OUTBOX, docs/decisions/0034): a
client that sends and never reads is disconnected, its replies are not buffered without bound.
Raw stubs on a real gRPC server started with a small bound."""

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import GrpcClient
from tests.grpc.conftest import GrpcServer, own_server
from tests.support.grpc import WAIT, Telemetry, signed
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

OUTBOX = 2
CLIENT_ID = "deaf-host@1@0@producer"


@pytest.fixture(scope="module")
def bounded_server(django_db_setup: None) -> Iterator[GrpcServer]:
    yield from own_server("test-grpc-outbox.log", {"TXHUB_GRPC_STREAM_OUTBOX": str(OUTBOX)})


def held(client_id: str) -> bool:
    return GrpcClient.objects.filter(client_id=client_id).exclude(stream_process="").exists()


def test_a_client_that_never_reads_is_disconnected(
    bounded_server: GrpcServer, rocketmq_setup: Any
) -> None:
    setup = rocketmq_setup("-deaf")
    # Each settings reply echoes the client's settings: the most topics a client may name, each
    # as long as a name may be (limits.check_client_topics), make a reply of about 128 KiB; 150
    # of them (19 MiB) are more than HTTP/2 flow control and the sockets' buffers let through to
    # a client that does not read.
    topics = [f"t{i:04d}" + "x" * 122 for i in range(1000)]
    with grpc.insecure_channel(bounded_server.endpoint) as channel:
        stream = Telemetry.unread(
            MessagingServiceStub(channel), signed(bounded_server, setup, CLIENT_ID)
        )
        try:
            assert wait_until(lambda: held(CLIENT_ID), timeout=WAIT)  # the stream is open
            for _ in range(150):
                stream.send_settings(topics)
            ended = wait_until(lambda: not held(CLIENT_ID), timeout=WAIT)
        finally:
            stream.close()
    assert ended, "a stream whose client does not read is still held"
