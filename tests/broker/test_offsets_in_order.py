"""CONTRACT invariant 5: a consumer never skips a message, even when producers commit
concurrently into the same queue."""

import random
import threading
import time
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

    def slow_commit() -> None:
        with transaction.atomic():
            transactions.transaction_commit(transaction_id=first.transaction_id, actor=PRODUCER)
            a_has_committed_in_its_transaction.set()
            time.sleep(1.5)  # B and the consumer run while A's transaction is open
        connection.close()

    def fast_commit() -> None:
        a_has_committed_in_its_transaction.wait()
        transactions.transaction_commit(transaction_id=second.transaction_id, actor=PRODUCER)
        connection.close()

    def consume() -> None:
        a_has_committed_in_its_transaction.wait()
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline and len(received) < 2:
            for r in consuming.message_receive(
                group=ConsumerGroup.objects.get(pk=consumers.pk),
                topic=topic,
                max_messages=32,
                invisible_seconds=60,
            ):
                received.append(bytes(r.message.body).decode())
            time.sleep(0.05)
        connection.close()

    threads = [threading.Thread(target=f) for f in (slow_commit, fast_commit, consume)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert received == ["A", "B"]


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
            tx = session.post(
                server.url("/api/v1/transactions"),
                headers=producer,
                timeout=30,
                json={"producer_group": "shop", "topic": "ledger", "body": f"{worker}-{i}"},
            ).json()
            time.sleep(rng.random() * 0.05)  # some transactions stay open while others commit
            resolved = session.post(
                server.url(f"/api/v1/transactions/{tx['transaction_id']}/commit"),
                headers=producer,
                timeout=30,
            )
            assert resolved.status_code == 200
            with lock:
                committed.append(tx["msg_id"])

    def consume() -> None:
        session = requests.Session()
        idle_after_done = 0
        while idle_after_done < 3:
            batch = session.post(
                server.url("/api/v1/consumer-groups/audit/receive"),
                headers=consumer,
                json={"topic": "ledger", "max_messages": 32},
                timeout=30,
            ).json()["messages"]
            for message in batch:
                received[message["msg_id"]] = message["queue_offset"]
            if batch:
                session.post(
                    server.url("/api/v1/consumer-groups/audit/ack"),
                    headers=consumer,
                    timeout=30,
                    json={"receipt_handles": [m["receipt_handle"] for m in batch]},
                )
            elif producers_done.is_set():
                idle_after_done += 1

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(6)]
    reader = threading.Thread(target=consume)
    reader.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    producers_done.set()
    reader.join(timeout=60)
    assert set(received) == set(committed)
    assert sorted(received.values()) == list(range(len(committed)))
