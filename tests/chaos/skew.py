"""F12: the Celery side's clock runs ahead of the database's. The database clock decides what is
due, so a skewed worker checks nothing early and delivers nothing early."""

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import requests

from tests.support.faketime import running_ahead

if TYPE_CHECKING:
    from tests.chaos.run import Context

SKEW_SECONDS = 600


def worker_clock_skewed(ctx: "Context", *, transaction_timeout: float) -> None:
    """Every Celery worker and beat run 600 s ahead (libfaketime); web and Postgres do not. No
    check may reach the producer before its transaction's timeout (on the producer's clock) and
    no delayed message may reach a consumer before its time."""
    # Monotonic clocks are shifted too (a constant offset, harmless): with
    # FAKETIME_DONT_FAKE_MONOTONIC, Python 3.11's time.sleep fails with EINVAL and beat dies.
    ctx.cluster.celery_restart(**running_ahead(SKEW_SECONDS))
    delayed = DelayedProbe(ctx, count=5, delay=max(6.0, 20 * ctx.scale))
    try:
        delayed.send()
        time.sleep(20 * ctx.scale)
        delayed.receive_all(timeout=60)
    finally:
        ctx.cluster.celery_restart()
    prepared = ctx.cluster.sql(
        "SELECT h.transaction_id::text, extract(epoch FROM h.born_at)::float FROM "
        "broker_halfmessage h JOIN broker_topic t ON t.id = h.topic_id WHERE t.name = %s",
        [ctx.workload.topic],
    )
    first_check = ctx.endpoint.first_check
    checked = [(tid, born) for tid, born in prepared if tid in first_check]
    if not checked:
        ctx.violations.append("no transaction was checked: the fault did not bite")
    early = [
        f"{tid} checked {first_check[tid] - born:.2f} s after prepare (timeout "
        f"{transaction_timeout:.0f} s)"
        for tid, born in checked
        # 50 ms: born_at is stamped by the web process, the check's arrival by this one.
        if first_check[tid] < born + transaction_timeout - 0.05
    ]
    ctx.violations.extend(early[:10])
    ctx.violations.extend(delayed.early[:10])


class DelayedProbe:
    """Delayed sends to a topic and group of the case's own, received until all arrive; records
    any that arrived before their deliver_at (this box's clock is the database's)."""

    def __init__(self, ctx: "Context", *, count: int, delay: float) -> None:
        self.api, self.headers = ctx.workload.api, ctx.workload.headers
        self.producer = ctx.workload.producer
        self.topic, self.group = f"{ctx.workload.topic}-delayed", f"{ctx.workload.topic}-late"
        self.count, self.delay = count, delay
        self.due: dict[str, float] = {}
        self.early: list[str] = []
        for path, payload in [
            ("/topics", {"name": self.topic, "queues": 1}),
            ("/consumer-groups", {"name": self.group}),
        ]:
            response = requests.post(
                self.api + path, json=payload, headers=self.headers, timeout=10
            )
            assert response.status_code == 201, response.text

    def send(self) -> None:
        for n in range(self.count):
            deliver_at = time.time() + self.delay
            response = requests.post(
                f"{self.api}/topics/{self.topic}/messages",
                json={
                    "producer_group": self.producer,
                    "body": f"late-{n}",
                    "deliver_at": datetime.fromtimestamp(deliver_at, UTC).isoformat(),
                },
                headers=self.headers,
                timeout=10,
            )
            assert response.status_code == 201, response.text
            self.due[f"late-{n}"] = deliver_at

    def receive_all(self, *, timeout: float) -> None:
        deadline, seen = time.monotonic() + timeout, set[str]()
        while len(seen) < self.count and time.monotonic() < deadline:
            response = requests.post(
                f"{self.api}/consumer-groups/{self.group}/receive",
                json={"topic": self.topic, "max_messages": 16, "wait_seconds": 1},
                headers=self.headers,
                timeout=10,
            )
            assert response.status_code == 200, response.text
            arrived = time.time()
            for message in response.json()["messages"]:
                body = message["body"]
                seen.add(body)
                if arrived < self.due[body]:
                    self.early.append(f"{body} received {self.due[body] - arrived:.2f} s early")
        assert len(seen) == self.count, f"delayed messages never arrived: {self.count - len(seen)}"
