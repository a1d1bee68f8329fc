"""CONTRACT invariants 2 and 5 through the gRPC door (tests/broker/test_concurrent_resolution.py and
test_offsets_in_order.py do the same over HTTP): concurrent EndTransaction COMMIT and ROLLBACK
resolve a transaction once; concurrent producers' commits never let a consumer skip an offset.
Raw stubs with signed metadata, many calls in flight at once on the real server."""

import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import CommitLogEntry, HalfMessage, OpRecord
from tests.grpc.conftest import GrpcServer, Setup
from tests.support.grpc import signed

pytestmark = pytest.mark.e2e


def prepare(stub: MessagingServiceStub, meta: Any, setup: Setup, body: str) -> tuple[str, str]:
    request = rpc.SendMessageRequest()
    item = request.messages.add()
    item.topic.name = setup.topic
    item.body = body.encode()
    item.system_properties.message_id = uuid.uuid4().hex.upper()
    item.system_properties.message_type = pb.TRANSACTION
    answer = stub.SendMessage(request, metadata=meta)
    assert answer.status.code == pb.Code.OK, answer.status
    return answer.entries[0].message_id, answer.entries[0].transaction_id


def end(
    stub: MessagingServiceStub, meta: Any, setup: Setup, ids: tuple[str, str], resolution: int
) -> Any:
    request = rpc.EndTransactionRequest(
        topic=pb.Resource(name=setup.topic),
        message_id=ids[0],
        transaction_id=ids[1],
        resolution=resolution,
        source=pb.SOURCE_CLIENT,
    )
    return stub.EndTransaction(request, metadata=meta).status


def test_concurrent_end_transaction_commit_and_rollback_resolve_once(
    grpc_server: GrpcServer, rocketmq_setup: Any, stub: MessagingServiceStub
) -> None:
    setup = rocketmq_setup("-race")
    meta = signed(grpc_server, setup, "racer")
    prepared = [prepare(stub, meta, setup, f"order {i}") for i in range(24)]

    def race(ids: tuple[str, str]) -> dict[str, Any]:
        barrier = threading.Barrier(2)

        def resolve(resolution: int) -> Any:
            barrier.wait(timeout=30)
            return end(stub, meta, setup, ids, resolution)

        with ThreadPoolExecutor(2) as pool:
            commit = pool.submit(resolve, pb.COMMIT)
            rollback = pool.submit(resolve, pb.ROLLBACK)
            return {"commit": commit.result(), "rollback": rollback.result()}

    with ThreadPoolExecutor(8) as pool:
        results = dict(zip(prepared, pool.map(race, prepared), strict=True))

    committed = set()
    for (msg_id, _), answers in results.items():
        codes = sorted(status.code for status in answers.values())
        assert codes == sorted([pb.Code.OK, pb.Code.BAD_REQUEST]), (msg_id, answers)
        winner = "commit" if answers["commit"].code == pb.Code.OK else "rollback"
        loser = answers["rollback" if winner == "commit" else "commit"]
        assert "already" in loser.message, loser  # the loser is told why
        half = HalfMessage.objects.get(msg_id=msg_id)
        assert half.state == ("COMMITTED" if winner == "commit" else "ROLLED_BACK")
        finals = OpRecord.objects.filter(half=half, op__in=["COMMIT", "ROLLBACK"])
        assert [op.op for op in finals] == [winner.upper()]
        if winner == "commit":
            committed.add(msg_id)
    assert (
        set(CommitLogEntry.objects.filter(topic__name=setup.topic).values_list("msg_id", flat=True))
        == committed
    )


def test_concurrent_grpc_producers_lose_no_offset(
    grpc_server: GrpcServer, rocketmq_setup: Any, stub: MessagingServiceStub
) -> None:
    setup = rocketmq_setup("-offsets")
    meta = signed(grpc_server, setup, "offsets")
    committed: list[str] = []
    lock = threading.Lock()
    producers_done = threading.Event()
    received: dict[str, tuple[int, int]] = {}

    def produce(worker: int) -> None:
        rng = random.Random(worker)  # noqa: S311
        for i in range(12):
            ids = prepare(stub, meta, setup, f"{worker}-{i}")
            time.sleep(rng.random() * 0.05)  # some stay open while others commit
            status = end(stub, meta, setup, ids, pb.COMMIT)
            assert status.code == pb.Code.OK, status
            with lock:
                committed.append(ids[0])

    def consume() -> None:
        idle_after_done = 0
        while idle_after_done < 3:
            receive = rpc.ReceiveMessageRequest(
                group=pb.Resource(name=setup.consumer),
                message_queue=pb.MessageQueue(topic=pb.Resource(name=setup.topic), id=-1),
                filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
                batch_size=32,
            )
            answers = list(stub.ReceiveMessage(receive, metadata=meta))
            batch = [a.message for a in answers if a.HasField("message")]
            assert answers[0].status.code in (pb.Code.OK, pb.Code.MESSAGE_NOT_FOUND)
            for message in batch:
                system = message.system_properties
                assert system.message_id not in received  # acked: never handed out again
                received[system.message_id] = (system.queue_id, system.queue_offset)
            if batch:
                ack = rpc.AckMessageRequest(
                    group=pb.Resource(name=setup.consumer), topic=pb.Resource(name=setup.topic)
                )
                for message in batch:
                    ack.entries.add(
                        message_id=message.system_properties.message_id,
                        receipt_handle=message.system_properties.receipt_handle,
                    )
                acked = stub.AckMessage(ack, metadata=meta)
                assert acked.status.code == pb.Code.OK, acked.status
            elif producers_done.is_set():
                idle_after_done += 1

    with ThreadPoolExecutor(5) as pool:
        reader = pool.submit(consume)
        try:
            for future in [pool.submit(produce, w) for w in range(4)]:
                future.result(timeout=120)  # a failed assert in a producer fails the test
        finally:
            producers_done.set()  # also on failure, so the reader ends and the pool can close
        reader.result(timeout=120)
    assert len(committed) == 4 * 12
    assert set(received) == set(committed)
    by_queue: dict[int, list[int]] = {}
    for queue_id, offset in received.values():
        by_queue.setdefault(queue_id, []).append(offset)
    for offsets in by_queue.values():  # dense per queue: 0, 1, 2, ... nothing skipped
        assert sorted(offsets) == list(range(len(offsets)))
