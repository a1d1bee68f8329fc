"""Prometheus metrics: event counters kept by the processes that see the events, and gauges read
from Postgres when /metrics is scraped.

State (pending, parked, delayed, lag, DLQ) lives in Postgres, so it is read at scrape time: any
web process answers the same, whichever process changed it. Events (resolutions, check-back
attempts and latency, delay lateness) happen in web and Celery processes alike; when
PROMETHEUS_MULTIPROC_DIR is set (`make run` sets it) each process writes them to that directory
and the scrape sums them, which is prometheus-client's multiprocess mode (decision 0007).
"""

import os
from collections.abc import Iterator

from django.db import connection
from django.db import transaction as db_transaction
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from apps.broker.selectors import consumer_lag
from apps.broker.services.storage_usage import stored_bytes

# Instruments live in their own registry: in single-process mode (tests, `manage.py shell`) the
# scrape reads it directly; in multiprocess mode their values are read back from the files.
EVENTS = CollectorRegistry(auto_describe=True)

RESOLUTIONS = Counter(
    "txhub_transactions_resolved",
    "Transactions resolved, by outcome and by who resolved them.",
    ["outcome", "resolved_by"],
    registry=EVENTS,
)
CHECKBACK_ATTEMPTS = Counter(
    "txhub_checkback_attempts",
    "Check-back calls to producers, by result (COMMIT, ROLLBACK, UNKNOWN, unreachable).",
    ["result"],
    registry=EVENTS,
)
CHECKBACK_LATENCY = Histogram(
    "txhub_checkback_latency_seconds",
    "Time from sending a check-back request to its answer (reached producers only).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=EVENTS,
)
SCAN_ROWS_FAILED = Counter(
    "txhub_scan_rows_failed",
    "Rows a periodic scan could not process (logged with their id and skipped), by scan.",
    ["scan"],
    registry=EVENTS,
)
LEAN_ANSWERS = Counter(
    "txhub_lean_door_answers",
    "API calls answered by the lean door (apps/broker/api/lean.py), by view; the rest by Django.",
    ["view"],
    registry=EVENTS,
)
RECEIVES_KNOWN_EMPTY = Counter(
    "txhub_receives_known_empty",
    "Waiting receives (REST and gRPC) that waited at once, without a query: this process knew "
    "their topic empty for their group (apps/broker/waiting.py, decision 0026).",
    registry=EVENTS,
)
DELAY_LATENESS = Histogram(
    "txhub_delayed_delivery_lateness_seconds",
    "How long after its due time a delayed message entered the commit log.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
    registry=EVENTS,
)


def count_resolution(*, outcome: str, resolved_by: str) -> None:
    """Counted once the database transaction that resolved it commits, never for a rollback."""
    db_transaction.on_commit(
        lambda: RESOLUTIONS.labels(outcome=outcome, resolved_by=resolved_by).inc()
    )


def observe_all(histogram: Histogram, values: list[float]) -> None:
    for value in values:
        histogram.observe(value)


# Gauges read at scrape time. Each is one grouped query; none touches a message body.
STATE_SQL = """
SELECT t.name, h.state, count(*), EXTRACT(EPOCH FROM now() - min(h.born_at))
FROM broker_halfmessage h JOIN broker_topic t ON t.id = h.topic_id
WHERE h.state IN ('PREPARED', 'PARKED') GROUP BY t.name, h.state
"""
DELAYED_SQL = """
SELECT t.name, count(*) FROM broker_delayedmessage d JOIN broker_topic t ON t.id = d.topic_id
GROUP BY t.name
"""


class DatabaseCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        transactions = GaugeMetricFamily(
            "txhub_transactions",
            "Unresolved transactions by topic and state.",
            labels=["topic", "state"],
        )
        oldest = GaugeMetricFamily(
            "txhub_oldest_transaction_age_seconds",
            "Age of the oldest unresolved transaction by topic and state.",
            labels=["topic", "state"],
        )
        delayed = GaugeMetricFamily(
            "txhub_delayed_messages", "Delayed messages waiting for their time.", labels=["topic"]
        )
        lag = GaugeMetricFamily(
            "txhub_consumer_lag",
            "Messages committed but not yet received (ready) plus received and not acked.",
            labels=["group", "topic"],
        )
        in_flight = GaugeMetricFamily(
            "txhub_consumer_in_flight", "Received, not yet acked.", labels=["group", "topic"]
        )
        dlq = GaugeMetricFamily(
            "txhub_dlq_messages", "Messages in the dead-letter queue.", labels=["group", "topic"]
        )
        stored = GaugeMetricFamily(
            "txhub_producer_group_stored_bytes",
            "Bytes of messages a producer group keeps stored, as last measured; at or over "
            "TXHUB_PRODUCER_GROUP_STORAGE_QUOTA its sends and prepares are refused.",
            labels=["producer_group"],
        )
        for group, kept in stored_bytes().items():
            stored.add_metric([group], kept)
        with connection.cursor() as cursor:
            cursor.execute(STATE_SQL)
            for topic, state, count, age in cursor.fetchall():
                transactions.add_metric([topic, state], count)
                oldest.add_metric([topic, state], float(age))
            cursor.execute(DELAYED_SQL)
            for topic, count in cursor.fetchall():
                delayed.add_metric([topic], count)
        for row in consumer_lag():
            labels = [row["group"], row["topic"]]
            lag.add_metric(labels, row["lag"])
            in_flight.add_metric(labels, row["in_flight"])
            dlq.add_metric(labels, row["dlq"])
        yield from (transactions, oldest, delayed, lag, in_flight, dlq, stored)


def scrape_registry(database: Collector | None = None) -> CollectorRegistry:
    """The scrape's registry; `database` replaces the Postgres gauges (e.g. a cached copy)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(database or DatabaseCollector())
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry.register(EVENTS)
    return registry
