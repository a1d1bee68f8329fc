"""Liveness and readiness probes (plain JSON, no auth) and the Prometheus scrape endpoint."""

import hmac
import threading
import time
from collections.abc import Iterator

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from apps.broker.metrics import DatabaseCollector, scrape_registry
from txhub.redis_sentinel import broker_client


class CachedCollector(Collector):
    """The Postgres gauges, read at most once per TXHUB_METRICS_CACHE_SECONDS in this process: a
    scrape storm (or several Prometheus servers) costs one query set per interval, not one per
    scrape. Event counters are not cached: they are read from memory or the multiprocess files."""

    def __init__(self, inner: Collector) -> None:
        self.inner = inner
        self.metrics: list[Metric] = []
        self.read_at: float | None = None
        # Why a lock: gunicorn's threads scrape concurrently; without it, every thread that finds
        # the copy stale would run the query set at the same moment, which is the storm again.
        self.lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        seconds = settings.TXHUB_METRICS_CACHE_SECONDS
        with self.lock:
            now = time.monotonic()
            if self.read_at is None or now - self.read_at >= seconds:
                self.metrics = list(self.inner.collect())
                self.read_at = time.monotonic()
            metrics = self.metrics
        yield from metrics


DATABASE_GAUGES = CachedCollector(DatabaseCollector())


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["postgres"] = "ok"
    except Exception as error:  # noqa: BLE001 - any failure means "not ready"
        checks["postgres"] = f"error: {error.__class__.__name__}"
    try:
        broker_client(socket_timeout=2).ping()
        checks["redis"] = "ok"
    except Exception as error:  # noqa: BLE001
        checks["redis"] = f"error: {error.__class__.__name__}"
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ok" if ready else "unavailable", "checks": checks}, status=200 if ready else 503
    )


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text format. Open like the probes unless TXHUB_METRICS_TOKEN is set."""
    expected = settings.TXHUB_METRICS_TOKEN
    if expected:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return HttpResponse("metrics token required\n", status=401, content_type="text/plain")
    registry = scrape_registry(DATABASE_GAUGES)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
