"""The gRPC door on real processes: `manage.py grpcserver` on the test database, the official
RocketMQ Python client (pinned in pyproject.toml), and real Celery for check-back."""

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.services import credentials, registry
from tests.conftest import BIN, ROOT, db_url_for_tests
from tests.e2e.conftest import FAST, TEST_BROKER_URL, Celery
from tests.support import workers
from tests.support.grpc import Telemetry, signed
from tests.support.ports import free_port


def start_grpc(port: int, log: Any, extra_env: dict[str, str] | None = None) -> Any:
    env = {
        **os.environ,
        "DATABASE_URL": db_url_for_tests(),
        "CELERY_BROKER_URL": TEST_BROKER_URL,
        "TXHUB_GRPC_PORT": str(port),
        # A PushConsumer's nack backoff (announced on Telemetry): seconds, not RocketMQ's minutes.
        "TXHUB_GRPC_CONSUMER_BACKOFF": "1,2",
        # The long poll PushConsumers are told to use: a client's shutdown waits for the one in
        # flight (Node 1.0.8 asks for none and gets the maximum, 20 s by default).
        "TXHUB_GRPC_LONG_POLL_MAX": "5",
        **FAST,
        **(extra_env or {}),
    }
    process = subprocess.Popen(
        [str(BIN / "python"), "manage.py", "grpcserver"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, "grpcserver exited"
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return process
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("grpcserver did not start")


def stop(process: Any) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=20)


@dataclass
class GrpcServer:
    port: int
    process: Any
    log: Any

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def restart(self) -> None:
        stop(self.process)
        self.process = start_grpc(self.port, self.log)


def own_server(log_name: str, extra_env: dict[str, str]) -> Iterator[GrpcServer]:
    """A gRPC server of a test's own, with settings of its own (`extra_env`), logging to
    var/<log_name>; for a fixture to yield from."""
    port = free_port()
    with open(workers.log_path(log_name), "w") as log:
        server = GrpcServer(port, start_grpc(port, log, extra_env), log)
        yield server
        stop(server.process)


@pytest.fixture(scope="session")
def grpc_server(django_db_setup: None) -> Iterator[GrpcServer]:
    port = free_port()
    with open(workers.log_path("test-grpc.log"), "w") as log:
        server = GrpcServer(port, start_grpc(port, log), log)
        yield server
        stop(server.process)


@pytest.fixture(autouse=True)
def _client_event_loop(event_loop_in_main_thread: None) -> None:
    """Every gRPC test may start the official client (tests/conftest.py says why)."""


@pytest.fixture
def clients() -> Iterator[list[Any]]:
    """The RocketMQ Python clients a test started (tests.support.grpc.start), shut down after it."""
    started: list[Any] = []
    yield started
    for client in reversed(started):
        client.shutdown()


@pytest.fixture(scope="module")
def celery_module(django_db_setup: None, tmp_path_factory: Any) -> Iterator[Celery]:
    """Celery (a scans worker, a callbacks worker, beat) shared by a module's tests."""
    celery = Celery(Path(tmp_path_factory.mktemp("celery")), {})
    celery.start_worker()
    celery.start_worker(concurrency=4, queue="callbacks")
    celery.start_beat()
    celery.wait_ready()
    yield celery
    celery.stop()


@dataclass(frozen=True)
class Setup:
    topic: str
    producer: str
    consumer: str
    access_key: str
    secret_key: str
    token_id: int


@pytest.fixture
def rocketmq_setup(transactional_db: None) -> Callable[..., Setup]:
    """A topic, a producer group (no check URL), a consumer group (FIFO if `fifo`) and a token
    for both, with its RocketMQ credentials."""

    def make(suffix: str = "", max_delivery_attempts: int = 16, fifo: bool = False) -> Setup:
        topic, producer, consumer = f"orders{suffix}", f"shop{suffix}", f"billing{suffix}"
        registry.topic_create(name=topic, queues=4)
        registry.producer_group_create(name=producer)
        registry.consumer_group_create(
            name=consumer,
            max_delivery_attempts=max_delivery_attempts,
            consume_from="first",
            fifo=fifo,
        )
        token, _ = registry.token_create(
            name="rocketmq", scopes=[f"produce:{producer}", f"consume:{consumer}"]
        )
        keys = credentials.of(token)
        return Setup(topic, producer, consumer, keys["access_key"], keys["secret_key"], token.pk)

    return make


@pytest.fixture
def stub(grpc_server: GrpcServer) -> Iterator[Any]:
    """Raw stubs over a channel of their own to the module's server."""
    with grpc.insecure_channel(grpc_server.endpoint) as channel:
        yield MessagingServiceStub(channel)


@pytest.fixture
def streams() -> Iterator[list[Telemetry]]:
    """Telemetry streams a test opened, closed after it."""
    opened: list[Telemetry] = []
    yield opened
    for stream in opened:
        stream.close()


@pytest.fixture
def door(grpc_server: GrpcServer, rocketmq_setup: Callable[..., Setup]) -> Iterator[Any]:
    """A producer's raw door: the setup, stubs on a channel that sends up to 16 MiB, and the
    signed metadata of a token that may produce for the setup's group."""
    setup = rocketmq_setup()
    token = registry.token_create(name="producer", scopes=[f"produce:{setup.producer}"])[0]
    options = [("grpc.max_send_message_length", 16 * 1024 * 1024)]
    with grpc.insecure_channel(grpc_server.endpoint, options=options) as channel:
        yield setup, MessagingServiceStub(channel), signed(grpc_server, token)
