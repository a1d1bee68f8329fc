"""RocketMQ client ids are owned (issue 24, item 1; docs/decisions/0034): the id a client
chooses belongs to the token that first used it. Another token using it (Telemetry, Heartbeat,
NotifyClientTermination) is refused FORBIDDEN and changes nothing; a check-back of the owner's
transaction reaches the owner's own producer (the official Python client), never the intruder."""

import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, Producer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.util.signature import Signature

from apps.broker.models import GrpcClient, OpRecord
from apps.broker.services import credentials, registry
from tests.e2e.conftest import wait_until
from tests.grpc.conftest import GrpcServer
from tests.grpc.test_python_client import Checker, clients, config, message, start, wait_for_state

pytestmark = pytest.mark.e2e
__all__ = ["clients"]  # the fixture, imported for this module


def signed(server: GrpcServer, token: Any, client_id: str) -> list[tuple[str, str]]:
    keys = credentials.of(token)
    config = ClientConfiguration(
        server.endpoint, Credentials(keys["access_key"], keys["secret_key"])
    )
    return list(Signature.metadata(config, client_id))


class RawStream:
    """A producer's Telemetry stream opened with raw stubs: its settings, then it stays open,
    keeping every command the server sends (a check would arrive here)."""

    def __init__(self, server: GrpcServer, meta: list[tuple[str, str]], topic: str) -> None:
        self.channel = grpc.insecure_channel(server.endpoint)
        self.stop = threading.Event()
        self.received: queue.Queue[Any] = queue.Queue()
        settings = rpc.TelemetryCommand(
            settings=pb.Settings(
                client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name=topic)])
            )
        )

        def commands() -> Iterator[Any]:
            yield settings
            self.stop.wait(60)

        self.answers = MessagingServiceStub(self.channel).Telemetry(commands(), metadata=meta)
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()

    def read(self) -> None:
        try:
            for answer in self.answers:
                self.received.put(answer)
        except grpc.RpcError:
            pass  # cancelled at close()
        self.received.put(None)

    def first(self) -> Any:
        return self.received.get(timeout=20)

    def commands(self) -> list[Any]:
        seen = []
        while not self.received.empty():
            seen.append(self.received.get_nowait())
        return seen

    def close(self) -> None:
        self.stop.set()
        self.answers.cancel()
        self.channel.close()


def victim_row(token_id: int) -> GrpcClient:
    row: GrpcClient | None = wait_until(
        lambda: (
            GrpcClient.objects.filter(
                token_id=token_id, client_type="PRODUCER", group__isnull=False
            )
            .exclude(stream_process="")
            .first()
        ),
        timeout=30,
    )
    assert row is not None, "the victim's producer never registered its stream"
    return row


def test_another_token_using_a_producers_client_id_is_refused_and_its_checks_stay_home(
    grpc_server: GrpcServer, celery_module: Any, rocketmq_setup: Any, clients: list[Any]
) -> None:
    setup = rocketmq_setup("-owned")
    checker = Checker()
    victim = start(clients, Producer(config(grpc_server, setup), (setup.topic,), checker))
    row = victim_row(setup.token_id)
    before = (row.token_id, row.group, row.client_type, row.stream_process)
    registry.producer_group_create(name="intruders")
    intruder = registry.token_create(name="intruder", scopes=["produce:intruders"])[0]
    stolen = signed(grpc_server, intruder, row.client_id)

    hijack = RawStream(grpc_server, stolen, setup.topic)
    refused = hijack.first()
    hijack.close()
    assert refused.status.code == pb.FORBIDDEN, refused
    assert "another client" in refused.status.message
    stub = MessagingServiceStub(grpc.insecure_channel(grpc_server.endpoint))
    beat = stub.Heartbeat(rpc.HeartbeatRequest(client_type=pb.PRODUCER), metadata=stolen)
    assert beat.status.code == pb.FORBIDDEN, beat.status
    ended = stub.NotifyClientTermination(rpc.NotifyClientTerminationRequest(), metadata=stolen)
    assert ended.status.code == pb.FORBIDDEN, ended.status
    row.refresh_from_db()
    assert (row.token_id, row.group, row.client_type, row.stream_process) == before

    # The positive control: the intruder under a client id of its own is served, and listens.
    own = RawStream(grpc_server, signed(grpc_server, intruder, "intruder-own-id"), setup.topic)
    assert own.first().status.code == pb.OK
    try:
        tx = victim.begin_transaction()
        prepared = victim.send(message(setup.topic, b"please commit"), tx)
        committed = wait_for_state(prepared.message_id, "COMMITTED")
        assert committed.resolved_by == "CHECK_BACK"
        assert prepared.message_id in checker.checked  # the victim's own producer was asked
        applied = [
            c.detail
            for c in OpRecord.objects.filter(half=committed, op="CHECK")
            if c.detail.get("applied")
        ]
        assert [d["client_id"] for d in applied] == [row.client_id]
        leaked = [
            c for c in own.commands() if c and c.HasField("recover_orphaned_transaction_command")
        ]
        assert leaked == []
    finally:
        own.close()


def test_a_check_is_not_sent_on_a_stream_whose_token_lost_the_scope(
    grpc_server: GrpcServer, celery_module: Any, rocketmq_setup: Any, clients: list[Any]
) -> None:
    """Read at forward time: the stream was opened with a token that could see the group's
    checks; once that token is revoked, nothing of the group goes out on it."""
    setup = rocketmq_setup("-revoked")
    registry.producer_group_create(name="shop-revoked-2")
    token = registry.token_create(name="own", scopes=[f"produce:{setup.producer}"])[0]
    stream = RawStream(grpc_server, signed(grpc_server, token, "soon-revoked"), setup.topic)
    assert stream.first().status.code == pb.OK
    checker = Checker()
    # The group's transaction, prepared by another instance that then exits.
    first = start(clients, Producer(config(grpc_server, setup), (setup.topic,), checker))
    tx = first.begin_transaction()
    prepared = first.send(message(setup.topic, b"please commit"), tx)
    clients.remove(first)
    first.shutdown()
    registry.token_revoke(token_id=token.pk)
    try:
        checked = wait_until(
            lambda: (
                OpRecord.objects.filter(
                    half__msg_id=prepared.message_id, op="CHECK", detail__client_id="soon-revoked"
                ).count()
                >= 2
            ),
            timeout=30,
        )
        assert checked, "check-back never chose the stream: the test shows nothing"
        sent = [
            c for c in stream.commands() if c and c.HasField("recover_orphaned_transaction_command")
        ]
        assert sent == []
    finally:
        stream.close()
