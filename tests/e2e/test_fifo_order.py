"""A FIFO consumer group on real processes (issue 29, decision 0054): the real gunicorn the tests
start, consumers as threads with HTTP sessions of their own. Per message group, messages come out
in commit-log order and the next one is not handed out while an earlier one is in flight; an
expired head comes back first; a dead-lettered head releases the next; a stuck group holds no
other group of its queue; transactions take their place in the group at commit."""

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pytest
import requests
from django.db import connection

from tests.conftest import Server
from tests.support.responses import expect

pytestmark = pytest.mark.e2e

GROUPS, ROUNDS, CONSUMERS = 50, 10, 4


class Api:
    """One HTTP session (a client of its own) with an admin token."""

    def __init__(self, server: Server, headers: dict[str, str]) -> None:
        self.base = server.url("/api/v1")
        self.headers = headers
        self.session = requests.Session()
        self.session.headers.update(headers)

    def post(self, path: str, payload: dict[str, Any], status: int = 200) -> Any:
        return expect(self.session.post(self.base + path, json=payload, timeout=30), status)

    def get(self, path: str) -> Any:
        return expect(self.session.get(self.base + path, timeout=30), 200)

    def setup(self, queues: int, **consumer: Any) -> None:
        self.post("/topics", {"name": "orders", "queues": queues}, 201)
        self.post("/producer-groups", {"name": "shop", "check_url": "http://127.0.0.1:9/"}, 201)
        self.post("/consumer-groups", {"name": "billing", "fifo": True, **consumer}, 201)

    def send(self, body: str, group: str = "") -> dict[str, Any]:
        payload = {"producer_group": "shop", "body": body}
        sent = self.post(
            "/topics/orders/messages", payload | ({"message_group": group} if group else {}), 201
        )
        assert (sent["message_group"] or "") == group, sent  # null without a group
        return dict(sent)

    def prepare(self, body: str, group: str) -> str:
        payload = {
            "producer_group": "shop",
            "topic": "orders",
            "body": body,
            "message_group": group,
        }
        return str(self.post("/transactions", payload, 201)["transaction_id"])

    def receive(self, max_messages: int = 16, invisible: int = 30, wait: int = 0) -> list[Any]:
        payload = {
            "topic": "orders",
            "max_messages": max_messages,
            "invisible_seconds": invisible,
            "wait_seconds": wait,
        }
        return list(self.post("/consumer-groups/billing/receive", payload)["messages"])

    def bodies(self, **kwargs: Any) -> list[str]:
        return [m["body"] for m in self.receive(**kwargs)]

    def ack(self, *handles: str) -> list[str]:
        answer = self.post("/consumer-groups/billing/ack", {"receipt_handles": list(handles)})
        assert answer["acked"] == list(handles), answer
        return list(answer["acked"])


@pytest.fixture
def api(server: Server) -> Api:
    return Api(server, server.token("admin"))


@dataclass
class Seen:
    group: int
    seq: int
    consumer: int
    received: float  # the receive's answer came (time.monotonic())
    ack_sent: float = 0.0


def test_fifty_groups_four_consumers_in_order_with_no_overtaking(server: Server, api: Api) -> None:
    """A producer sends round after round, one message to each of 50 groups (batches and single
    sends alternating): half the rounds before the consumers start (a backlog: most of each
    group waits behind its head), the rest while 4 consumers receive up to 8 at a time and ack
    after a short random while. Per group: received in sequence, each exactly once, none
    answered before the ack of the one before was sent."""
    api.setup(queues=4)
    headers = api.headers
    seen: list[Seen] = []
    lock = threading.Lock()
    total = GROUPS * ROUNDS
    done = threading.Event()

    def produce(rounds: range) -> None:
        producer = Api(server, headers)
        for seq in rounds:
            items = [{"body": f"{g}:{seq}", "message_group": f"order-{g}"} for g in range(GROUPS)]
            if seq % 2 == 0:
                payload = {"producer_group": "shop", "messages": items}
                producer.post("/topics/orders/messages:batch", payload, 201)
            else:
                for item in items:
                    producer.send(item["body"], item["message_group"])

    def consume(me: int) -> None:
        consumer = Api(server, headers)
        rng = random.Random(me)
        deadline = time.monotonic() + 120
        while not done.is_set():
            assert time.monotonic() < deadline, "the consumers did not get every message in time"
            messages = consumer.receive(max_messages=8, wait=1)
            now = time.monotonic()
            batch = []
            for m in messages:
                group, seq = map(int, m["body"].split(":"))
                batch.append(Seen(group, seq, me, now))
            time.sleep(rng.random() / 100)  # the work
            if messages:
                sent = time.monotonic()
                for item in batch:
                    item.ack_sent = sent
                consumer.ack(*[m["receipt_handle"] for m in messages])
                with lock:
                    seen.extend(batch)
                    if len(seen) >= total:
                        done.set()

    produce(range(ROUNDS // 2))
    with ThreadPoolExecutor(1 + CONSUMERS) as pool:
        futures = [pool.submit(produce, range(ROUNDS // 2, ROUNDS))]
        futures += [pool.submit(consume, n) for n in range(CONSUMERS)]
        for future in futures:
            future.result()  # a thread's exception fails the test here
    assert len(seen) == total
    by_group: dict[int, list[Seen]] = {}
    for item in sorted(seen, key=lambda s: s.received):
        by_group.setdefault(item.group, []).append(item)
    for group, items in by_group.items():
        assert [s.seq for s in items] == list(range(ROUNDS)), (group, [s.seq for s in items])
        for before, after in pairwise(items):
            assert after.received > before.ack_sent, (group, before, after)
    # The groups were spread over the consumers: concurrency, not one consumer doing it all.
    assert len({s.consumer for s in seen}) == CONSUMERS
    assert any(len({s.consumer for s in items}) > 1 for items in by_group.values())


def test_an_expired_head_is_redelivered_before_the_next(api: Api) -> None:
    api.setup(queues=1)
    for n in range(3):
        api.send(f"g-{n}", "g")
    [head] = api.receive(invisible=10)
    assert (head["body"], head["delivery_attempt"]) == ("g-0", 1)
    assert api.receive() == []  # g-1 and g-2 are held behind it
    again = api.receive(invisible=10, wait=15)  # once its invisible time (10 s) runs out
    assert [(m["body"], m["delivery_attempt"]) for m in again] == [("g-0", 2)]
    api.ack(again[0]["receipt_handle"])
    nxt = api.receive()
    assert [m["body"] for m in nxt] == ["g-1"]
    api.ack(nxt[0]["receipt_handle"])
    assert api.bodies() == ["g-2"]


def test_a_dead_lettered_head_releases_the_next(api: Api) -> None:
    api.setup(queues=1, max_delivery_attempts=1)
    for n in range(2):
        api.send(f"g-{n}", "g")
    [head] = api.receive(invisible=10)
    assert head["body"] == "g-0"
    assert api.receive() == []
    # Its one attempt used and its invisible time over: the receive dead-letters it, then hands
    # out the next.
    assert api.bodies(invisible=10, wait=15) == ["g-1"]
    dead = api.get("/consumer-groups/billing/dlq")
    assert [m["msg_id"] for m in dead["results"]] == [head["msg_id"]], dead


def test_a_stuck_group_does_not_hold_another_group_of_its_queue(api: Api) -> None:
    """One queue: A's held message comes before all of B's in it, and a message without a
    group after them; A's head stays unacked throughout."""
    api.setup(queues=1)
    for body, group in [("A-0", "A"), ("A-1", "A"), ("B-0", "B"), ("B-1", "B"), ("B-2", "B")]:
        api.send(body, group)
    api.send("no group", "")
    [stuck] = api.receive(max_messages=1)
    assert stuck["body"] == "A-0"
    got = []
    for _ in range(5):
        messages = api.receive()
        got += [m["body"] for m in messages]
        if messages:
            api.ack(*[m["receipt_handle"] for m in messages])
    assert [b for b in got if b.startswith("B")] == ["B-0", "B-1", "B-2"]
    assert "no group" in got
    assert "A-1" not in got
    api.ack(stuck["receipt_handle"])
    assert api.bodies() == ["A-1"]


def test_transactions_take_their_place_at_commit(api: Api) -> None:
    """Prepared A then B, committed B then A: B comes first, and A only after B's ack. A rolled
    back and a still PREPARED transaction of the group, both prepared before, hold nothing."""
    api.setup(queues=1)
    rolled_back, pending = api.prepare("C", "order-9527"), api.prepare("D", "order-9527")
    a, b = api.prepare("A", "order-9527"), api.prepare("B", "order-9527")
    api.post(f"/transactions/{rolled_back}/rollback", {})
    api.post(f"/transactions/{b}/commit", {})
    api.post(f"/transactions/{a}/commit", {})
    first = api.receive()
    assert [m["body"] for m in first] == ["B"]
    assert api.receive() == []
    api.ack(first[0]["receipt_handle"])
    second = api.receive()
    assert [m["body"] for m in second] == ["A"]
    assert second[0]["queue_offset"] > first[0]["queue_offset"]
    assert api.get(f"/transactions/{pending}")["state"] == "PREPARED"


def test_concurrent_receives_of_many_free_heads_answer_200(server: Server, api: Api) -> None:
    """Many message groups, each with a backlog, and consumers receiving up to 1-32 at a time at
    once: their receives release overlapping sets of held heads, of every size. Each must
    answer 200 (a deadlock between two of them is a 500 `internal_error`, decision 0078)."""
    api.setup(queues=4)
    groups, depth, consumers = 300, 4, 8
    for seq in range(depth):
        for first in range(0, groups, 50):
            items = [
                {"body": f"{g}:{seq}", "message_group": f"order-{g}"}
                for g in range(first, first + 50)
            ]
            payload = {"producer_group": "shop", "messages": items}
            api.post("/topics/orders/messages:batch", payload, 201)
    # Every group's head in flight and the rest held, the statistics saying so (as autovacuum's
    # would under load), then the heads acked: hundreds of free heads for the receives below.
    heads = []
    while batch := api.receive(max_messages=32):
        heads += [m["receipt_handle"] for m in batch]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE broker_delivery")
    api.ack(*heads)
    left = [groups * (depth - 1)]
    lock = threading.Lock()

    def consume(me: int) -> None:
        consumer = Api(server, api.headers)
        rng = random.Random(me)
        deadline = time.monotonic() + 120
        while True:
            with lock:
                if left[0] <= 0:
                    return
            assert time.monotonic() < deadline, "the consumers did not get every message in time"
            messages = consumer.receive(max_messages=rng.randint(1, 32))
            if messages:
                consumer.ack(*[m["receipt_handle"] for m in messages])
                with lock:
                    left[0] -= len(messages)

    with ThreadPoolExecutor(consumers) as pool:
        for future in [pool.submit(consume, n) for n in range(consumers)]:
            future.result()  # a 500 in any consumer fails the test here
