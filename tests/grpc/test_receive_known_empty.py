"""gRPC ReceiveMessage waits as the REST receive does (apps/broker/waiting.py, decision 0047): a
consumer that long-polls a topic this process knows empty for its group waits at once, without
asking Postgres (the known-empty shortcut, decision 0026). Seen in the server's own counter of
such receives (`txhub_receives_known_empty`, prometheus-client's multiprocess files), and the
message sent afterwards still reaches the next receive."""

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from prometheus_client.multiprocess import MultiProcessCollector
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import Topic
from apps.broker.services import sending
from tests.grpc.conftest import GrpcServer, Setup, own_server
from tests.support.grpc import signed

pytestmark = pytest.mark.e2e


@pytest.fixture
def counted_server(django_db_setup: None, tmp_path: Path) -> Iterator[GrpcServer]:
    """A gRPC server of its own, writing its counters to `tmp_path` as under `make run`."""
    yield from own_server("test-grpc-known-empty.log", {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})


def known_empty_receives(directory: Path) -> float:
    files = [str(file) for file in directory.glob("counter_*.db")]
    merged = MultiProcessCollector.merge(files, accumulate=True)  # type: ignore[no-untyped-call]
    return sum(
        float(sample.value)
        for family in merged
        for sample in family.samples
        if sample.name == "txhub_receives_known_empty_total"
    )


def test_a_grpc_long_poll_on_a_topic_known_empty_waits_without_a_try(
    counted_server: GrpcServer,
    rocketmq_setup: Callable[..., Setup],
    tmp_path: Path,
) -> None:
    setup = rocketmq_setup()
    meta = signed(counted_server, setup)
    receive = rpc.ReceiveMessageRequest(
        group=pb.Resource(name=setup.consumer),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=setup.topic), id=-1),
        batch_size=1,
        long_polling_timeout=Duration(seconds=1),
    )
    with grpc.insecure_channel(counted_server.endpoint) as channel:
        stub = MessagingServiceStub(channel)

        def receive_once() -> list[Any]:
            return list(stub.ReceiveMessage(receive, metadata=meta, timeout=10))

        # The first waits start the hub's LISTEN connection; once it listens, a try that found
        # nothing is noted, and the next receive skips its try. A handful is plenty.
        for _ in range(6):
            [answer] = receive_once()
            assert answer.status.code == pb.Code.MESSAGE_NOT_FOUND, answer.status
            if known_empty_receives(tmp_path) > 0:
                break
        assert known_empty_receives(tmp_path) > 0, "no ReceiveMessage took the known-empty path"
        # The note ends with the NOTIFY of a message: the next receive gets it.
        sending.message_send(
            topic=Topic.objects.get(name=setup.topic),
            message=sending.OutgoingMessage(
                producer_group=setup.producer, body=b"late", body_is_binary=False
            ),
        )
        answers = receive_once()
    assert answers[0].status.code == pb.Code.OK, answers[0].status
    assert [a.message.body for a in answers if a.HasField("message")] == [b"late"]
