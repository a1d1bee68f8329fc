"""The Python SDK with message groups and a FIFO consumer group, against the real server."""

from typing import Any

import requests
from txhub_client import Message, Producer, SimpleConsumer

from tests.conftest import Server
from tests.support.responses import expect


def test_the_sdk_sends_message_groups_and_a_fifo_consumer_gets_them_in_order(
    shop: Any, server: Server
) -> None:
    admin = server.token("admin")
    fifo = {"name": "ledger", "fifo": True}
    created = requests.post(
        server.url("/api/v1/consumer-groups"), json=fifo, headers=admin, timeout=10
    )
    assert expect(created, 201)["fifo"] is True
    token = server.token("produce:shop", "consume:ledger")["Authorization"].split()[1]
    producer = Producer(shop["url"], token, "shop")
    sent = [
        producer.send(Message("orders", f"{g}{i}", message_group=g)) for i in range(3) for g in "AB"
    ]
    assert [s.message_group for s in sent] == ["A", "B"] * 3
    consumer = SimpleConsumer(shop["url"], token, "ledger", topic="orders")
    order: list[str] = []
    for _ in range(3):
        got = consumer.receive(max_messages=32)
        assert sorted(m.message_group or "" for m in got) == ["A", "B"], got
        order += sorted(str(m.body) for m in got)
        consumer.ack(got)
    assert order == ["A0", "B0", "A1", "B1", "A2", "B2"]
