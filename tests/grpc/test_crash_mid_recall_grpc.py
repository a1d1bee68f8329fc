"""CONTRACT invariant 4 at the gRPC door: a gRPC process killed (SIGKILL) in the middle of a
RecallMessage (decisions 0055, 0075) leaves the message waiting, never recalled and delivered
both, nor taken off the storage measure's count (0085, 0089) without being deleted; the same
recall made to the process started again is applied whole. On a gRPC server of the test's own
(tests/support/killed_mid_write.py says how it is killed mid-way)."""

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.services import storage_usage
from apps.broker.services.delivery import delayed_deliver_due
from tests.grpc.conftest import GrpcServer, Setup, start_grpc, stop
from tests.support import workers
from tests.support.grpc import signed
from tests.support.killed_mid_write import SECONDS, call_killed, execute, rows
from tests.support.ports import free_port
from tests.support.statement_faults import own_connection
from tests.support.storage import counted_for_good

pytestmark = [pytest.mark.e2e, pytest.mark.destructive]


@pytest.fixture
def own_grpc(transactional_db: None) -> Iterator[GrpcServer]:
    """A gRPC server of the test's own, stopped after it unless it lies killed."""
    port = free_port()
    with open(workers.log_path("test-grpc-crash-mid-recall.log"), "w") as log:
        server = GrpcServer(port, start_grpc(port, log), log)
        try:
            yield server
        finally:
            if server.process.poll() is None:
                stop(server.process)


def _delayed_bytes(group: str) -> int:
    [(kept,)] = rows(
        "SELECT coalesce(sum(counted + recent), 0) FROM broker_storedbytes "
        "WHERE producer_group = %s AND stored_table = 'broker_delayedmessage'",
        group,
    )
    return int(kept)


def test_a_grpc_recall_killed_before_its_commit_leaves_the_message_waiting(
    own_grpc: GrpcServer, rocketmq_setup: Callable[..., Setup]
) -> None:
    setup = rocketmq_setup("-crash")
    with grpc.insecure_channel(own_grpc.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        send = rpc.SendMessageRequest()
        for i in range(2):
            item = send.messages.add()
            item.topic.name = setup.topic
            item.body = f"delayed {i}".encode()
            item.system_properties.message_id = f"01CRASHMIDRECALL00000000000000000{i}"
            item.system_properties.message_type = pb.DELAY
            item.system_properties.delivery_timestamp.seconds = int(time.time()) + 60
        sent = stub.SendMessage(send, metadata=signed(own_grpc, setup))
        assert sent.status.code == pb.Code.OK, sent.status
    kept, recalled = (entry.message_id for entry in sent.entries)
    handle = sent.entries[1].recall_handle
    counted_for_good()  # both rows counted for good (decisions 0085, 0095)
    before = _delayed_bytes(setup.producer)
    assert before > 0

    def recall() -> Any:
        with grpc.insecure_channel(own_grpc.endpoint) as channel:
            request = rpc.RecallMessageRequest(
                topic=pb.Resource(name=setup.topic), recall_handle=handle
            )
            return MessagingServiceStub(channel).RecallMessage(
                request, metadata=signed(own_grpc, setup), timeout=SECONDS
            )

    def kill() -> None:
        os.killpg(own_grpc.process.pid, signal.SIGKILL)
        own_grpc.process.wait(timeout=30)

    with own_connection(autocommit=False) as holder:
        # The recall's last statement (forget_rows) waits for this, after its INSERT and DELETE.
        holder.execute(
            "SELECT 1 FROM broker_storedbytes WHERE producer_group = %s FOR UPDATE",
            [setup.producer],
        )
        answer = call_killed(recall, kill, holder)
    assert isinstance(answer, grpc.RpcError), answer  # never answered
    assert rows("SELECT msg_id FROM broker_recalledmessage") == []
    assert {r[0] for r in rows("SELECT msg_id FROM broker_delayedmessage")} == {kept, recalled}
    assert _delayed_bytes(setup.producer) == before

    own_grpc.process = start_grpc(own_grpc.port, own_grpc.log)
    again = recall()
    assert again.status.code == pb.Code.OK, again.status
    assert again.message_id == recalled
    assert [r[0] for r in rows("SELECT msg_id FROM broker_delayedmessage")] == [kept]
    [(size,)] = rows(
        f"SELECT {storage_usage.SIZE_SQL.format(t='m')} FROM broker_recalledmessage m"  # noqa: S608
    )
    assert _delayed_bytes(setup.producer) == before - size  # taken off once
    execute("UPDATE broker_delayedmessage SET deliver_at = now() - interval '1 second'")
    delayed_deliver_due()
    assert [r[0] for r in rows("SELECT msg_id FROM broker_commitlogentry")] == [kept]
