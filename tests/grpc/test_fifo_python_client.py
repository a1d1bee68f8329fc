"""FIFO (message groups) with the official RocketMQ Python client 5.1.2, unchanged, on real
processes: a Producer sending to several message groups, a SimpleConsumer and a PushConsumer in a
FIFO consumer group (docs/rocketmq-clients.md, docs/decisions/0056)."""

import threading
import time
from collections import defaultdict
from typing import Any

import pytest
from rest_framework.test import APIClient
from rocketmq import (
    ConsumeResult,
    MessageListener,
    Producer,
)

from apps.broker.models import CommitLogEntry, Delivery
from tests.conftest import client_for
from tests.grpc.conftest import GrpcServer
from tests.support.grpc import config, consumer_of, message, receive_all, start
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

GROUPS = [f"order-{n}" for n in range(5)]
PER_GROUP = 4
INVISIBLE = 10  # seconds: the shortest invisible time a receive may ask for


def send_interleaved(producer: Any, topic: str, rounds: range) -> dict[str, list[str]]:
    """Round `i` sends message `i` of every group: the groups' messages interleave."""
    sent: dict[str, list[str]] = defaultdict(list)
    for i in rounds:
        for group in GROUPS:
            receipt = producer.send(message(topic, f"{group}:{i}".encode(), message_group=group))
            sent[group].append(receipt.message_id)
    return sent


def test_producer_groups_and_simple_consumer_receives_each_group_in_order_with_a_retry(
    grpc_server: GrpcServer, rocketmq_setup: Any, clients: list[Any]
) -> None:
    setup = rocketmq_setup("-fifo-simple", fifo=True)
    producer = start(clients, Producer(config(grpc_server, setup), (setup.topic,)))
    sent = send_interleaved(producer, setup.topic, range(PER_GROUP))
    # Stored with its group, every message of a group on one queue.
    for group, ids in sent.items():
        rows = CommitLogEntry.objects.filter(msg_id__in=ids)
        assert {(row.message_group, row.queue_id) for row in rows} == {(group, rows[0].queue_id)}, (
            group
        )

    consumer = consumer_of(clients, grpc_server, setup, await_duration=5)
    # While a group's head is in flight nothing else of that group is received: the heads only.
    heads = receive_all(consumer, len(GROUPS), invisible=INVISIBLE)
    first_receipt = time.monotonic()
    assert sorted((m.message_group, m.message_id) for m in heads) == sorted(
        (group, ids[0]) for group, ids in sent.items()
    )
    assert not consumer.receive(32, INVISIBLE)
    # Every head but the first group's is acked; that one's invisible time runs out.
    stuck = GROUPS[0]
    log: list[tuple[str, str, int, float]] = [
        (m.message_group, m.message_id, m.delivery_attempt, first_receipt) for m in heads
    ]
    for item in heads:
        if item.message_group != stuck:
            consumer.ack(item)

    def done() -> bool:
        return sum(1 for entry in log if entry[2] == 1) == len(GROUPS) * PER_GROUP and any(
            entry[2] == 2 for entry in log
        )

    deadline = time.monotonic() + 60
    while not done() and time.monotonic() < deadline:
        for item in consumer.receive(32, INVISIBLE) or []:
            assert item.message_group in GROUPS, item.message_group
            log.append(
                (item.message_group, item.message_id, item.delivery_attempt, time.monotonic())
            )
            consumer.ack(item)
    assert done(), log

    received = {group: [(i, a) for g, i, a, _ in log if g == group] for group in GROUPS}
    head, *rest = sent[stuck]
    # The expired head is received again (attempt 2) before anything after it in its group.
    assert received[stuck] == [(head, 1), (head, 2), *[(msg_id, 1) for msg_id in rest]]
    for group in GROUPS[1:]:
        assert received[group] == [(msg_id, 1) for msg_id in sent[group]], group
    # The stuck group held up no other group: they were all done before its head came back.
    again = next(at for g, i, a, at in log if a == 2)
    assert again - first_receipt >= INVISIBLE - 1
    assert max(at for g, _, _, at in log if g != stuck) < again
    states = Delivery.objects.filter(group__name=setup.consumer).values_list("state", flat=True)
    assert set(states) == {"ACKED"}


class OrderedListener(MessageListener):  # type: ignore[misc]
    """Records every call; fails a body starting "retry" on its first two calls and one starting
    "poison" always; notes any two calls of one message group that overlap."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[str, list[tuple[str, int, float]]] = defaultdict(list)
        self.busy: dict[str, int] = defaultdict(int)
        self.overlaps: list[str] = []

    def consume(self, message: Any) -> Any:
        group, body = message.message_group, message.body.decode()
        with self.lock:
            if self.busy[group]:
                self.overlaps.append(body)
            self.busy[group] += 1
            self.calls[group].append((body, message.delivery_attempt, time.monotonic()))
            tries = sum(1 for seen, _, _ in self.calls[group] if seen == body)
        time.sleep(0.05)  # long enough for an overlapping call of the group to be seen
        with self.lock:
            self.busy[group] -= 1
        if body.startswith("poison") or (body.startswith("retry") and tries <= 2):
            return ConsumeResult.FAILURE
        return ConsumeResult.SUCCESS

    def bodies(self, group: str) -> list[tuple[str, int]]:
        with self.lock:
            return [(body, attempt) for body, attempt, _ in self.calls[group]]


def test_fifo_push_consumer_retries_in_place_and_its_dead_letter_releases_the_group(
    grpc_server: GrpcServer, rocketmq_setup: Any, clients: list[Any]
) -> None:
    """The group allows 3 attempts; the server announces a 1 s, then 2 s backoff. The client
    retries a FIFO message itself (delivery attempt stays 1), then forwards it to the
    dead-letter queue; only then is the next message of its group received."""
    setup = rocketmq_setup("-fifo-push", max_delivery_attempts=3, fifo=True)
    listener = OrderedListener()
    consumer = consumer_of(clients, grpc_server, setup, listener, consumption_thread_count=4)
    assert wait_until(lambda: consumer.fifo, timeout=20)  # the settings said fifo = true
    producer = start(clients, Producer(config(grpc_server, setup), (setup.topic,)))

    def send(group: str, body: str) -> str:
        return str(
            producer.send(message(setup.topic, body.encode(), message_group=group)).message_id
        )

    ids = {"A:0": send("A", "retry A:0"), "B:0": send("B", "poison B:0"), "C:0": send("C", "C:0")}
    # The heads are in the client's hands before the rest is sent: a message sent later must
    # wait for its head on the server, not merely in the client's batch.
    assert wait_until(lambda: listener.bodies("A") and listener.bodies("B"), timeout=30)
    for i in (1, 2):
        for group in ("A", "B", "C"):
            ids[f"{group}:{i}"] = send(group, f"{group}:{i}")

    def finished() -> bool:
        return all(len(listener.bodies(g)) == n for g, n in (("A", 5), ("B", 5), ("C", 3)))

    assert wait_until(finished, timeout=60), dict(listener.calls)
    assert listener.bodies("A") == [("retry A:0", 1)] * 3 + [("A:1", 1), ("A:2", 1)]
    assert listener.bodies("B") == [("poison B:0", 1)] * 3 + [("B:1", 1), ("B:2", 1)]
    assert listener.bodies("C") == [("C:0", 1), ("C:1", 1), ("C:2", 1)]
    assert listener.overlaps == []
    # In place, with the announced backoff between the tries.
    times = [at for body, _, at in listener.calls["A"] if body == "retry A:0"]
    assert times[1] - times[0] >= 0.9, times
    assert times[2] - times[1] >= 1.9, times

    rest: APIClient = client_for(f"consume:{setup.consumer}")
    answer = rest.get(f"/api/v1/consumer-groups/{setup.consumer}/dlq")
    assert answer.status_code == 200, answer.content
    # Delivered once by the server: the client's own forward put it there, not the expiry.
    assert [(e["msg_id"], e["attempts"]) for e in answer.json()["results"]] == [(ids["B:0"], 1)]

    def acked() -> bool:
        states = dict(
            Delivery.objects.filter(group__name=setup.consumer).values_list(
                "message__msg_id", "state"
            )
        )
        return states == {msg_id: "DLQ" if key == "B:0" else "ACKED" for key, msg_id in ids.items()}

    assert wait_until(acked, timeout=10)
