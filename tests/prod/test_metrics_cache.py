"""/metrics under a scrape storm: the Postgres gauges cost one query set per interval."""

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from apps.broker.services import registry
from tests.support.metrics import METRICS_HEADERS
from tests.support.transactions import make_group, prepare
from txhub.health import DATABASE_GAUGES


def topics_in(text: str) -> set[str]:
    """Topics with unresolved transactions, as the scrape shows them."""
    return {
        sample.labels["topic"]
        for family in text_string_to_metric_families(text)
        if family.name == "txhub_transactions"
        for sample in family.samples
    }


@pytest.mark.django_db
def test_many_scrapes_within_the_interval_run_the_queries_once(settings: Any) -> None:
    settings.TXHUB_METRICS_CACHE_SECONDS = 3600  # the whole test sits inside one interval
    DATABASE_GAUGES.read_at = None  # an earlier test's copy does not count
    group = make_group()
    prepare(group, registry.topic_create(name="orders", queues=2))
    client = Client()
    with CaptureQueriesContext(connection) as first:
        text = client.get("/metrics", headers=METRICS_HEADERS).content.decode()
    assert len(first) >= 2  # the first scrape reads Postgres
    assert "orders" in topics_in(text)

    prepare(group, registry.topic_create(name="payments", queues=2))
    with CaptureQueriesContext(connection) as storm:
        answers = [client.get("/metrics", headers=METRICS_HEADERS) for _ in range(200)]
    assert {a.status_code for a in answers} == {200}
    assert len(storm) == 0  # 200 scrapes, not one query
    assert "payments" not in topics_in(answers[-1].content.decode())  # the cached copy

    # Once the interval is over, the next scrape reads Postgres again, and only that one.
    settings.TXHUB_METRICS_CACHE_SECONDS = 0
    with CaptureQueriesContext(connection) as after:
        fresh = client.get("/metrics", headers=METRICS_HEADERS).content.decode()
    assert len(after) == len(first)
    assert "payments" in topics_in(fresh)
