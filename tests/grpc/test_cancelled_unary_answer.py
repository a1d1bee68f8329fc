"""A unary RPC whose client leaves while grpc writes its answer (a client's cancel or deadline
after the handler returned): grpc writes a unary answer itself, after the handler, and logged
the write the core then refused as an ERROR with a traceback unless it had already seen the
cancel. It is a client leaving, one DEBUG line as for a stream (decisions 0104, 0115). A handler
that fails is still an ERROR, and its client is told INTERNAL_ERROR in plain words.

The server is txhub's own, served in the test's process so that caplog sees its log
(tests/support/grpc_in_process.py); the client is grpcio's, over a real connection through a
proxy that can hold the server's bytes back, so that the answer's write waits for the client's
flow-control window while the client cancels."""

import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.util.signature import Signature

from apps.broker import limits
from apps.broker.models import CommitLogEntry
from apps.broker.services import registry
from tests.grpc.conftest import Setup
from tests.support.grpc import raw_message
from tests.support.grpc_in_process import grpc_in_process
from tests.support.proxy import TcpProxy, pipe
from tests.support.statement_faults import statement_ended
from tests.support.waiting import wait_until

BOUND = 30.0  # seconds a step may take (a bound, not a measurement)
SERVICE = "/apache.rocketmq.v2.MessagingService"
# The client's stream window stays at 64 KiB (no BDP probe growing it): a route of the widest
# topic, its queues each naming the longest access point, is about 1 MiB and waits for it.
WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 65536)]
WIDE = "wide"


class AnswersHeld(TcpProxy):
    """Forwards the client's bytes to the server; the server's, until `holding` is set, after
    which it reads and counts them (`held`) without passing them on: the client never sees the
    answer, so never opens its window for the rest of it."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.holding = threading.Event()
        self.held = 0
        super().__init__(upstream)

    def serve(self, client: socket.socket) -> None:
        server = socket.create_connection(self.upstream, timeout=BOUND)
        threading.Thread(target=pipe, args=(client, server), daemon=True).start()
        try:
            while chunk := server.recv(65536):
                if self.holding.is_set():
                    self.held += len(chunk)
                else:
                    client.sendall(chunk)
        except OSError:
            pass


@pytest.fixture
def endpoint(transactional_db: None) -> Iterator[str]:
    with grpc_in_process() as address:
        yield address


@pytest.fixture
def meta(endpoint: str, rocketmq_setup: Callable[..., Setup]) -> tuple[Setup, list[Any]]:
    setup = rocketmq_setup()
    config = ClientConfiguration(endpoint, Credentials(setup.access_key, setup.secret_key))
    return setup, list(Signature.metadata(config, "client-leaving"))


def about(caplog: pytest.LogCaptureFixture, method: str) -> list[tuple[int, str]]:
    """What the server logged naming `method`'s RPC: (level, message)."""
    path = f"{SERVICE}/{method}"
    return [(r.levelno, r.getMessage()) for r in caplog.records if path in r.getMessage()]


def wide_route_request() -> Any:
    host = "h" * limits.MAX_ACCESS_POINT_HOST_CHARS
    addresses = [pb.Address(host=host, port=8081)] * limits.MAX_ACCESS_POINT_ADDRESSES
    return rpc.QueryRouteRequest(
        topic=pb.Resource(name=WIDE),
        endpoints=pb.Endpoints(scheme=pb.DOMAIN_NAME, addresses=addresses),
    )


def test_a_client_leaving_while_its_unary_answer_is_written_is_one_debug_line(
    endpoint: str, meta: tuple[Setup, list[Any]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    setup, metadata = meta
    registry.topic_create(name=WIDE, queues=limits.MAX_QUEUES)
    host, port = endpoint.split(":")
    proxy = AnswersHeld((host, int(port)))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{proxy.port}", options=WINDOW) as channel:
            stub = MessagingServiceStub(channel)
            # The connection is up (the client has the server's settings) before bytes are held.
            small = rpc.QueryRouteRequest(topic=pb.Resource(name=setup.topic))
            assert stub.QueryRoute(small, metadata=metadata, timeout=BOUND).status.code == pb.OK
            proxy.holding.set()
            call = stub.QueryRoute.future(wide_route_request(), metadata=metadata, timeout=BOUND)
            # The handler has returned and grpc is writing its answer: more of it has come than
            # any headers, and the rest waits for the client's window.
            wait_until(lambda: proxy.held > 32 * 1024, timeout=BOUND, interval=0.01)
            call.cancel()
            wait_until(lambda: about(caplog, "QueryRoute"), timeout=BOUND)
    finally:
        proxy.close()
    assert about(caplog, "QueryRoute") == [
        (logging.DEBUG, f"RPC cancelled for servicer method [{SERVICE}/QueryRoute]")
    ]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_unary_handler_that_fails_is_still_an_error_told_in_plain_words(
    endpoint: str, meta: tuple[Setup, list[Any]], caplog: pytest.LogCaptureFixture
) -> None:
    """The positive control: a send whose statement Postgres cancels (a failed query, not an
    unreachable database) is logged once as an error with its traceback, and the client reads
    INTERNAL_ERROR "Internal error." in the answer's status."""
    setup, metadata = meta
    request = rpc.SendMessageRequest(messages=[raw_message(setup.topic)])
    with grpc.insecure_channel(endpoint) as channel:
        stub = MessagingServiceStub(channel)
        with statement_ended("broker_commitlogentry", "cancel") as ended:
            answer = stub.SendMessage(request, metadata=metadata, timeout=BOUND)
    assert ended, "no send waited on the lock"
    assert (answer.status.code, answer.status.message) == (pb.INTERNAL_ERROR, "Internal error.")
    [error] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert error.getMessage() == "gRPC SendMessage failed"
    assert error.exc_info is not None
    assert not CommitLogEntry.objects.exists()
