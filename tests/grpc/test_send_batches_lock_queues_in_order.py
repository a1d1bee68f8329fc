"""A SendMessage batch is one database transaction (decision 0068): its messages take their
queue rows in the order every appending transaction takes them, so two batches crossing the same
queues in opposite orders queue up instead of deadlocking."""

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection

from apps.broker.grpc import producers
from apps.broker.grpc.protocol import pb
from apps.broker.models import CommitLogEntry
from apps.broker.services import registry, sending


def message_id(queue: int, n: int) -> str:
    """A client id (hex, as RocketMQ's) that lands on `queue` of a topic with four queues."""
    return f"{n * 4 + queue:032X}"


def test_two_batches_crossing_two_queues_both_store(
    transactional_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = registry.topic_create(name="orders", queues=4)
    group = registry.producer_group_create(name="shop")

    def checked(msg_id: str) -> producers.Checked:
        message = sending.OutgoingMessage(producer_group="shop", body=b"x", body_is_binary=False)
        return producers.Checked(topic, message, msg_id, False, None)

    # Batch A sends to queue 1 then queue 2; batch B to queue 2 then queue 1.
    batches = {
        "A": [checked(message_id(1, 1)), checked(message_id(2, 2))],
        "B": [checked(message_id(2, 3)), checked(message_id(1, 4))],
    }
    # Each batch holds its first queue's row, then waits for the other to hold one too (the
    # interleaving that deadlocks when the batches lock in the order sent). A batch that waits
    # for a row the other holds never comes: the barrier's timeout lets the holder go on.
    barrier = threading.Barrier(2, timeout=3)
    first_done: set[str] = set()
    stored_one = producers.stored_one

    def paced(caller: Any, producer_group: Any, item: producers.Checked) -> Any:
        entry = stored_one(caller, producer_group, item)
        name = threading.current_thread().name
        if name not in first_done:
            first_done.add(name)
            # Broken: the other batch waits for this one's queue, as the order says it must.
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()
        return entry

    monkeypatch.setattr(producers, "stored_one", paced)

    def send(name: str) -> list[Any]:
        threading.current_thread().name = name
        try:
            return producers.stored(None, group, batches[name])  # type: ignore[arg-type]
        finally:
            connection.close()

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(send, name) for name in batches]
        answers = [future.result(timeout=30) for future in futures]  # re-raises a deadlock
    for answer, name in zip(answers, batches, strict=True):
        assert [entry.status.code for entry in answer] == [pb.OK, pb.OK]
        # Answered in the order sent, whatever order they were stored in.
        assert [entry.message_id for entry in answer] == [m.msg_id for m in batches[name]]
    stored = set(CommitLogEntry.objects.values_list("msg_id", flat=True))
    assert stored == {m.msg_id for batch in batches.values() for m in batch}
