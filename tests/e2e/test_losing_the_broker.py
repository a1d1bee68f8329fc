"""Postgres is the truth, Celery carries only triggers: killing a worker mid-batch, stopping Redis
for 20 s, or running two workers loses nothing and applies nothing twice."""

import time
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import Count
from django.utils import timezone
from rest_framework.test import APIClient

from apps.broker.models import CommitLogEntry, DelayedMessage, HalfMessage, OpRecord
from tests.e2e.conftest import PrivateRedis
from tests.support.responses import expect
from tests.support.waiting import wait_until

# An outage of 20 s, then up to 90 + 30 s of recovery: more than the suite's 300 s bound allows
# for on a busy machine.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.destructive, pytest.mark.timeout(600)]


@pytest.fixture
def shop(api: APIClient, checker: Any) -> None:
    expect(api.post("/api/v1/topics", {"name": "orders", "queues": 4}, format="json"), 201)
    expect(
        api.post(
            "/api/v1/producer-groups", {"name": "shop", "check_url": checker.url}, format="json"
        ),
        201,
    )


def prepare_many(api: APIClient, n: int) -> list[str]:
    return [
        expect(
            api.post(
                "/api/v1/transactions",
                {"producer_group": "shop", "topic": "orders", "body": str(i)},
                format="json",
            ),
            201,
        )["transaction_id"]
        for i in range(n)
    ]


def delay_many(api: APIClient, n: int, seconds: int = 1) -> None:
    for i in range(n):
        sent = api.post(
            "/api/v1/topics/orders/messages",
            {"producer_group": "shop", "body": f"d{i}", "delay_level": seconds},
            format="json",
        )
        assert expect(sent, 201)["queue_offset"] is None  # delayed, not yet in the log


def assert_each_once(ids: list[str]) -> None:
    finals = OpRecord.objects.filter(half__transaction_id__in=ids, op__in=["COMMIT", "ROLLBACK"])
    per = finals.values("half_id").annotate(n=Count("id"))
    assert len(per) == len(ids)
    assert all(row["n"] == 1 for row in per)
    assert CommitLogEntry.objects.filter(transaction_id__in=ids).count() == len(ids)


def test_a_killed_worker_loses_nothing_and_applies_nothing_twice(
    start_celery: Any, api: APIClient, shop: None, checker: Any
) -> None:
    def slow_commit(body: dict[str, Any]) -> tuple[int, bytes]:
        time.sleep(0.3)  # keep checks in flight when the worker dies
        return 200, b'{"state": "COMMIT"}'

    checker.decide = slow_commit
    celery = start_celery(TXHUB_CHECK_HTTP_TIMEOUT="1")
    ids = prepare_many(api, 30)
    delay_many(api, 30)
    assert wait_until(lambda: checker.requests, timeout=15, interval=0.05)  # checks under way
    celery.kill_worker(celery.workers[0])
    partly = HalfMessage.objects.filter(transaction_id__in=ids, state="COMMITTED").count()
    assert partly < len(ids)  # the kill happened mid-way
    celery.start_worker()
    assert wait_until(
        lambda: not HalfMessage.objects.filter(transaction_id__in=ids, state="PREPARED").exists(),
        timeout=60,
    )
    assert wait_until(lambda: not DelayedMessage.objects.exists(), timeout=30)
    assert_each_once(ids)
    assert CommitLogEntry.objects.filter(transaction_id__isnull=True).count() == 30


def test_redis_down_for_20_seconds_delays_work_and_loses_none(
    start_celery: Any, api: APIClient, shop: None, checker: Any, private_redis: PrivateRedis
) -> None:
    checker.answer("COMMIT")
    # The broker is a Redis of this test's own: stopping it harms nothing else (issue 27).
    celery = start_celery(CELERY_BROKER_URL=private_redis.url(1))
    private_redis.shutdown()
    assert private_redis.cli("ping") != "PONG"  # the fault really happened
    try:
        ids = prepare_many(api, 20)  # the API does not need the broker
        delay_many(api, 20)
        time.sleep(20)
        assert HalfMessage.objects.filter(transaction_id__in=ids, state="PREPARED").count() == 20
    finally:
        private_redis.start()  # the same port: the workers reconnect to it
    # Losing the broker must not kill a worker (else nothing resumes below).
    dead = [w.returncode for w in celery.workers if w.poll() is not None]
    assert dead == [], f"a celery worker exited when Redis went away: {dead}; see celery.log"
    assert wait_until(
        lambda: not HalfMessage.objects.filter(transaction_id__in=ids, state="PREPARED").exists(),
        timeout=90,
    )
    assert wait_until(lambda: not DelayedMessage.objects.exists(), timeout=30)
    assert_each_once(ids)
    assert CommitLogEntry.objects.filter(transaction_id__isnull=True).count() == 20


def test_two_workers_never_check_one_transaction_at_once_nor_deliver_twice(
    start_celery: Any, api: APIClient, shop: None, checker: Any
) -> None:
    in_flight: dict[str, int] = {}
    overlaps: list[str] = []

    def watch(body: dict[str, Any]) -> tuple[int, bytes]:
        tx = body["transaction_id"]
        in_flight[tx] = in_flight.get(tx, 0) + 1
        if in_flight[tx] > 1:
            overlaps.append(tx)
        time.sleep(0.2)
        in_flight[tx] -= 1
        return 200, b'{"state": "UNKNOWN"}'

    checker.decide = watch
    celery = start_celery(workers=2, TXHUB_CHECK_MAX="2")
    ids = prepare_many(api, 20)
    delay_many(api, 40)
    assert wait_until(
        lambda: not HalfMessage.objects.filter(transaction_id__in=ids, state="PREPARED").exists(),
        timeout=60,
    )
    assert wait_until(lambda: not DelayedMessage.objects.exists(), timeout=30)
    # No overlap means something only if both scan workers scanned at the same time.
    scanners = [w for w in celery.workers if "callbacks" not in w.args]
    assert len(scanners) == 2
    for worker in scanners:
        ran = celery.tasks_run_by(worker)
        for scan in ("checkback_scan", "delayed_delivery_scan"):
            assert ran.get(f"apps.broker.tasks.{scan}", 0) > 0, (worker.args, ran)
    assert overlaps == []
    for tx in ids:
        assert len(checker.checks_of(tx)) == 2  # exactly TXHUB_CHECK_MAX, none doubled
    entries = CommitLogEntry.objects.filter(transaction_id__isnull=True)
    assert entries.count() == 40
    assert entries.values("msg_id").distinct().count() == 40
    assert timezone.now() - entries.latest("stored_at").stored_at < timedelta(minutes=5)
