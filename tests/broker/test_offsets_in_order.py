"""CONTRACT invariant 5: a consumer never skips a message, even when producers commit
concurrently into the same queue."""

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests
from django.db import connection, transaction

from apps.broker.models import ConsumerGroup, ProducerGroup, Resolver, Topic
from apps.broker.services import consuming, registry, transactions
from apps.broker.services.sending import OutgoingMessage
from apps.broker.services.transactions import Actor
from tests.conftest import Server

PRODUCER = Actor(Resolver.PRODUCER, "test")


def prepare(topic: Topic, group: ProducerGroup, body: str) -> Any:
    message = OutgoingMessage(producer_group=group.name, body=body.encode(), body_is_binary=False)
    return transactions.transaction_prepare(
        producer_group=group, topic=topic, message=message, actor=PRODUCER
    )


def test_a_commit_that_becomes_visible_late_is_not_skipped(transactional_db: None) -> None:
    """A commits first but its database transaction stays open; B commits meanwhile; a consumer
    reads in between. Offsets handed out without the queue lock would let B's offset 1 be read
    and the cursor move past A's offset 0 for ever."""
    topic = registry.topic_create(name="orders", queues=1)
    group = registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    consumers = registry.consumer_group_create(
        name="billing", max_delivery_attempts=16, consume_from="first"
    )
    first, second = prepare(topic, group, "A"), prepare(topic, group, "B")
    a_has_committed_in_its_transaction = threading.Event()
    received: list[str] = []

    b_started, a_closed = threading.Event(), threading.Event()
    reads_between: list[int] = []  # reads that began after B's commit began, ended before A's

    def slow_commit() -> None:
        try:
            with transaction.atomic():
                transactions.transaction_commit(transaction_id=first.transaction_id, actor=PRODUCER)
                a_has_committed_in_its_transaction.set()
                time.sleep(1.5)  # B and the consumer run while A's transaction is open
            a_closed.set()
        finally:
            connection.close()

    def fast_commit() -> None:
        try:
            assert a_has_committed_in_its_transaction.wait(timeout=30)
            b_started.set()
            transactions.transaction_commit(transaction_id=second.transaction_id, actor=PRODUCER)
        finally:
            connection.close()

    def consume() -> None:
        try:
            assert a_has_committed_in_its_transaction.wait(timeout=30)
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline and len(received) < 2:
                in_window = b_started.is_set() and not a_closed.is_set()
                for r in consuming.message_receive(
                    group=ConsumerGroup.objects.get(pk=consumers.pk),
                    topic=topic,
                    max_messages=32,
                    invisible_seconds=60,
                ):
                    received.append(bytes(r.message.body).decode())
                if in_window and not a_closed.is_set():
                    reads_between.append(len(received))
                time.sleep(0.05)
        finally:
            connection.close()

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(f) for f in (slow_commit, fast_commit, consume)]
        for future in futures:
            future.result(timeout=60)  # an assert failing in a thread fails the test
    assert received == ["A", "B"]
    # The positive control: the consumer did read while B was committing and A was still open
    # (and got nothing then: whatever B gets comes after A's open offset 0).
    assert reads_between
    assert set(reads_between) == {0}


def test_concurrent_producers_and_held_transactions_lose_no_offset(server: Server) -> None:
    admin = server.token("admin")
    s = requests.Session()

    def post(path: str, payload: dict[str, Any], headers: dict[str, str] = admin) -> dict[str, Any]:
        response = s.post(server.url(path), json=payload, headers=headers, timeout=30)
        assert response.status_code in (200, 201), response.text
        return dict(response.json())

    post("/api/v1/topics", {"name": "ledger", "queues": 1})
    post("/api/v1/producer-groups", {"name": "shop", "check_url": "http://127.0.0.1:9/"})
    post("/api/v1/consumer-groups", {"name": "audit"})
    producer = server.token("produce:shop")
    consumer = server.token("consume:audit")
    committed: list[str] = []
    lock = threading.Lock()
    producers_done = threading.Event()
    received: dict[str, int] = {}

    def produce(worker: int) -> None:
        session = requests.Session()
        rng = random.Random(worker)  # noqa: S311
        for i in range(15):
            prepared = session.post(
                server.url("/api/v1/transactions"),
                headers=producer,
                timeout=30,
                json={"producer_group": "shop", "topic": "ledger", "body": f"{worker}-{i}"},
            )
            assert prepared.status_code == 201, prepared.text
            tx = prepared.json()
            time.sleep(rng.random() * 0.05)  # some transactions stay open while others commit
            resolved = session.post(
                server.url(f"/api/v1/transactions/{tx['transaction_id']}/commit"),
                headers=producer,
                timeout=30,
            )
            assert resolved.status_code == 200, resolved.text
            with lock:
                committed.append(tx["msg_id"])

    def consume() -> None:
        session = requests.Session()
        idle_after_done = 0
        while idle_after_done < 3:
            answer = session.post(
                server.url("/api/v1/consumer-groups/audit/receive"),
                headers=consumer,
                json={"topic": "ledger", "max_messages": 32},
                timeout=30,
            )
            assert answer.status_code == 200, answer.text
            batch = answer.json()["messages"]
            for message in batch:
                assert message["msg_id"] not in received  # acked: never handed out again
                received[message["msg_id"]] = message["queue_offset"]
            if batch:
                handles = [m["receipt_handle"] for m in batch]
                acked = session.post(
                    server.url("/api/v1/consumer-groups/audit/ack"),
                    headers=consumer,
                    timeout=30,
                    json={"receipt_handles": handles},
                )
                assert acked.status_code == 200, acked.text
                assert sorted(acked.json()["acked"]) == sorted(handles)
                assert acked.json()["invalid"] == []
            elif producers_done.is_set():
                idle_after_done += 1

    with ThreadPoolExecutor(7) as pool:
        reader = pool.submit(consume)
        try:
            producers = [pool.submit(produce, w) for w in range(6)]
            for future in producers:
                future.result(timeout=120)  # a failed assert in a producer fails the test
        finally:
            producers_done.set()  # also on failure, so the reader ends and the pool can close
        reader.result(timeout=120)
    assert len(committed) == 6 * 15
    assert set(received) == set(committed)
    assert sorted(received.values()) == list(range(len(committed)))
