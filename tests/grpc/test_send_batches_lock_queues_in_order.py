"""A SendMessage batch is one database transaction (decision 0068): its messages take their
queue rows in the order every appending transaction takes them, so two batches crossing the same
queues in opposite orders queue up instead of deadlocking.

The interleaving that deadlocks when the batches lock in the order sent is made at the database:
each insert into the commit log waits (a trigger of the test's own) for an advisory lock that a
session of the test holds, so a batch that has taken its first queue's row stops there. The test
lets the lock go once both batches wait, as pg_stat_activity shows (docs/decisions/0098)."""

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from django.db import connection

from apps.broker.grpc import producers
from apps.broker.grpc.protocol import pb
from apps.broker.models import CommitLogEntry
from apps.broker.services import registry, sending
from tests.support.killed_mid_write import SECONDS, inserts_wait
from tests.support.statement_faults import own_connection

# The advisory lock each insert into the commit log waits for while the test holds it.
STEP = 0x7478_6839


@pytest.fixture
def wait_in_commit_log_insert(transactional_db: None) -> Iterator[None]:
    """A row trigger: it fires once the row's queue row is taken (the insert reads its offset
    from the statement's update of that row), so the batch waits holding it."""
    with inserts_wait("broker_commitlogentry", STEP, name="batch_order_test_wait"):
        yield


def message_id(queue: int, n: int) -> str:
    """A client id (hex, as RocketMQ's) that lands on `queue` of a topic with four queues."""
    return f"{n * 4 + queue:032X}"


def wait_until_both_wait(holder: psycopg.Connection) -> list[list[int]]:
    """Until two sessions of the test database wait for a lock, one of them for `holder`'s:
    the sessions each waits for. Locking in the order sent, both batches wait for `holder`, each
    holding its first queue's row; in the order every appender takes, one waits for `holder`
    and the other for that one's first queue row."""
    with own_connection(autocommit=True) as watcher:
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            waits = [
                row[0]
                for row in watcher.execute(
                    "SELECT pg_blocking_pids(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND cardinality(pg_blocking_pids(pid)) > 0"
                ).fetchall()
            ]
            if len(waits) == 2 and any(holder.info.backend_pid in pids for pids in waits):
                return waits
            time.sleep(0.02)
    raise AssertionError("the two batches never both waited")


def test_two_batches_crossing_two_queues_both_store(wait_in_commit_log_insert: None) -> None:
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

    def send(name: str) -> list[Any]:
        try:
            return producers.stored(None, group, batches[name])  # type: ignore[arg-type]
        finally:
            connection.close()

    with own_connection(autocommit=False) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", [STEP])
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(send, name) for name in batches]
            try:
                wait_until_both_wait(holder)
            finally:
                holder.rollback()  # the lock goes: each batch goes on to its second queue
            answers = [future.result(timeout=30) for future in futures]  # re-raises a deadlock
    for answer, name in zip(answers, batches, strict=True):
        assert [entry.status.code for entry in answer] == [pb.OK, pb.OK]
        # Answered in the order sent, whatever order they were stored in.
        assert [entry.message_id for entry in answer] == [m.msg_id for m in batches[name]]
    stored = set(CommitLogEntry.objects.values_list("msg_id", flat=True))
    assert stored == {m.msg_id for batch in batches.values() for m in batch}
