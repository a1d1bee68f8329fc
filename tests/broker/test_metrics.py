"""GET /metrics: Prometheus text with the state read from Postgres and the event counters.

Events are counted when the database transaction commits, hence transactional_db."""

import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from django.test import Client
from django.utils import timezone
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from apps.broker.models import Delivery, DeliveryState, HalfMessage, Resolver, TransactionState
from apps.broker.services import checkback, consuming, delivery, registry, sending, transactions
from apps.broker.services.sending import OutgoingMessage, message_send
from apps.broker.services.transactions import Actor
from tests.conftest import Server, start_gunicorn
from tests.support import workers
from tests.support.metrics import METRICS_HEADERS
from tests.support.ports import free_port
from tests.support.responses import expect
from tests.support.transactions import PRODUCER, make_group, prepare, result


@pytest.fixture(autouse=True)
def _fresh_gauges(settings: Any) -> None:
    """These tests change the database between scrapes and read the new state at once; the
    scrape-storm cache (TXHUB_METRICS_CACHE_SECONDS) has its own test in tests/prod."""
    settings.TXHUB_METRICS_CACHE_SECONDS = 0


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def scrape(client: Any = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = (client or Client()).get("/metrics", headers=METRICS_HEADERS)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    return samples(response.content.decode())


def resolved(values: dict[Any, float], outcome: str, by: str) -> float:
    key = ("txhub_transactions_resolved_total", (("outcome", outcome), ("resolved_by", by)))
    return values.get(key, 0.0)


def test_metrics_show_pending_and_parked_per_topic_and_the_oldest_age(db: None) -> None:
    group = make_group()
    orders, refunds = (registry.topic_create(name=n, queues=1) for n in ("orders", "refunds"))
    for _ in range(3):
        prepare(group, orders)
    parked = prepare(group, refunds)
    transactions.transaction_park(transaction_id=parked.transaction_id, actor=PRODUCER, reason="t")
    HalfMessage.objects.filter(topic=orders).update(born_at=timezone.now() - timedelta(minutes=5))

    values = scrape()

    assert values[("txhub_transactions", (("state", "PREPARED"), ("topic", "orders")))] == 3
    assert values[("txhub_transactions", (("state", "PARKED"), ("topic", "refunds")))] == 1
    assert ("txhub_transactions", (("state", "PREPARED"), ("topic", "refunds"))) not in values
    age = values[
        ("txhub_oldest_transaction_age_seconds", (("state", "PREPARED"), ("topic", "orders")))
    ]
    assert 299 <= age <= 360


def test_resolutions_are_counted_by_outcome_and_resolver_once(transactional_db: None) -> None:
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    before = scrape()
    first, second, third = (prepare(group, topic) for _ in range(3))
    transactions.transaction_commit(transaction_id=first.transaction_id, actor=PRODUCER)
    transactions.transaction_commit(transaction_id=first.transaction_id, actor=PRODUCER)  # repeat
    transactions.transaction_rollback(transaction_id=second.transaction_id, actor=PRODUCER)
    operator = Actor(Resolver.OPERATOR, "alice")
    transactions.transaction_commit(transaction_id=third.transaction_id, actor=operator, reason="x")

    after = scrape()

    def delta(outcome: str, by: str) -> float:
        return resolved(after, outcome, by) - resolved(before, outcome, by)

    assert delta("COMMITTED", "PRODUCER") == 1  # the repeat wrote nothing and counts nothing
    assert delta("ROLLED_BACK", "PRODUCER") == 1
    assert delta("COMMITTED", "OPERATOR") == 1


def test_checkback_attempts_and_latency_are_counted(transactional_db: None) -> None:
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    answered, unknown, unreachable = (prepare(group, topic) for _ in range(3))
    before = scrape()
    checkback.checkback_apply(half_id=answered.pk, result=result("COMMIT"))
    checkback.checkback_apply(half_id=unknown.pk, result=result("UNKNOWN"))
    checkback.checkback_apply(half_id=unreachable.pk, result=result("UNKNOWN", reached=False))
    after = scrape()

    def delta(key: tuple[str, tuple[tuple[str, str], ...]]) -> float:
        return after.get(key, 0) - before.get(key, 0)

    for answer in ("COMMIT", "UNKNOWN", "unreachable"):
        assert delta(("txhub_checkback_attempts_total", (("result", answer),))) == 1
    assert delta(("txhub_checkback_latency_seconds_count", ())) == 2  # reached ones only
    assert (
        resolved(after, "COMMITTED", "CHECK_BACK") - resolved(before, "COMMITTED", "CHECK_BACK")
        == 1
    )


def test_delay_lateness_delayed_depth_consumer_lag_and_dlq(transactional_db: None) -> None:
    topic = registry.topic_create(name="orders", queues=1)
    group = registry.consumer_group_create(
        name="billing", max_delivery_attempts=2, consume_from="first"
    )
    message = OutgoingMessage(producer_group="shop", body=b"x", body_is_binary=False)
    for _ in range(4):
        message_send(topic=topic, message=message)
    consuming.message_receive(group=group, topic=topic, max_messages=2, invisible_seconds=60)
    soon = timezone.now() + timedelta(hours=1)
    sending.delayed_store(
        topic_id=topic.pk,
        queue_id=0,
        msg_id="DELAYED1",
        message=message,
        deliver_at=soon,
        born_at=timezone.now(),
    )
    due = timezone.now() - timedelta(seconds=2)
    sending.delayed_store(
        topic_id=topic.pk,
        queue_id=0,
        msg_id="DELAYED2",
        message=message,
        deliver_at=due,
        born_at=timezone.now(),
    )
    before = scrape()
    assert delivery.delayed_deliver_due() == 1
    Delivery.objects.filter(group=group).update(state=DeliveryState.DLQ)  # both handed out
    consuming.message_receive(group=group, topic=topic, max_messages=1, invisible_seconds=60)
    after = scrape()

    lateness_count = ("txhub_delayed_delivery_lateness_seconds_count", ())
    assert after[lateness_count] - before.get(lateness_count, 0) == 1
    lateness_sum = ("txhub_delayed_delivery_lateness_seconds_sum", ())
    assert 2 <= after[lateness_sum] - before.get(lateness_sum, 0) < 30
    assert after[("txhub_delayed_messages", (("topic", "orders"),))] == 1
    labels = (("group", "billing"), ("topic", "orders"))
    # 5 in the log; 3 received (2 now dead-lettered, 1 in flight); 2 ready + 1 in flight.
    assert after[("txhub_consumer_lag", labels)] == 3
    assert after[("txhub_consumer_in_flight", labels)] == 1
    assert after[("txhub_dlq_messages", labels)] == 2


def test_metrics_token_is_required_when_configured(db: None, settings: Any) -> None:
    settings.TXHUB_METRICS_TOKEN = "s3cret"
    assert Client().get("/metrics").status_code == 401
    wrong = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer nope")
    assert wrong.status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


def committers(directory: Path) -> dict[str, float]:
    """Per process file of the multiprocess directory: the commits that process counted."""
    counted = {}
    for file in directory.glob("counter_*.db"):
        merged = MultiProcessCollector.merge([str(file)], accumulate=True)  # type: ignore[no-untyped-call]
        found = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in merged
            for sample in family.samples
        }
        if resolved(found, "COMMITTED", "PRODUCER"):
            counted[file.name] = resolved(found, "COMMITTED", "PRODUCER")
    return counted


def test_counters_of_every_gunicorn_worker_are_summed(
    transactional_db: None, tmp_path: Any
) -> None:
    """Multiprocess mode as `make run` uses it: whichever worker answers, the count is the sum."""
    port = free_port()
    with open(workers.log_path("test-gunicorn-metrics.log"), "w") as log:
        process = start_gunicorn(
            port,
            workers=2,
            threads=4,
            log=log,
            extra_env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)},
        )
    try:
        server = Server(f"http://127.0.0.1:{port}")
        admin = server.token("admin")
        topic = requests.post(
            server.url("/api/v1/topics"),
            json={"name": "orders", "queues": 2},
            headers=admin,
            timeout=10,
        )
        expect(topic, 201)
        group = requests.post(
            server.url("/api/v1/producer-groups"),
            json={"name": "shop", "check_url": "http://127.0.0.1:9/c"},
            headers=admin,
            timeout=10,
        )
        expect(group, 201)
        producer = server.token("produce:shop")
        committed = 0
        # A new connection per call (no keep-alive): calls land on either worker. Until each
        # worker has counted commits of its own, so the scrape below must sum two processes.
        while len(committers(tmp_path)) < 2:
            assert committed < 400, f"one worker took every commit: {committers(tmp_path)}"
            prepared = expect(
                requests.post(
                    server.url("/api/v1/transactions"),
                    json={"producer_group": "shop", "topic": "orders", "body": "b"},
                    headers={**producer, "Connection": "close"},
                    timeout=10,
                ),
                201,
            )
            requests.post(
                server.url(f"/api/v1/transactions/{prepared['transaction_id']}/commit"),
                headers={**producer, "Connection": "close"},
                timeout=10,
            ).raise_for_status()
            committed += 1
        counts = set()
        for _ in range(6):  # new connections land on either worker
            text = requests.get(server.url("/metrics"), headers=METRICS_HEADERS, timeout=10).text
            counts.add(resolved(samples(text), "COMMITTED", "PRODUCER"))
        assert counts == {float(committed)}
        assert HalfMessage.objects.filter(state=TransactionState.COMMITTED).count() == committed
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
