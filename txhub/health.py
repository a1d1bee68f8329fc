"""Liveness and readiness probes (plain JSON, no auth) and the Prometheus scrape endpoint (a
bearer token or an operator's session, docs/decisions/0090)."""

import hmac
import threading
import time
from collections.abc import Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from apps.broker.api.errors import unavailable_headers
from apps.broker.metrics import DatabaseCollector, scrape_registry
from apps.console import roles
from txhub.readiness import READINESS, ready


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
    """Postgres and Redis as this process last probed them: at most once a period, whatever the
    number of callers (txhub/readiness.py, docs/decisions/0086)."""
    checks = READINESS.current()
    if ready(checks):
        return JsonResponse({"status": "ok", "checks": checks})
    return JsonResponse(
        {"status": "unavailable", "checks": checks}, status=503, headers=unavailable_headers()
    )


def may_scrape(request: HttpRequest) -> bool:
    """Who may read /metrics, which names every tenant's topics and groups (docs/decisions/0090):
    the scraper sending TXHUB_METRICS_TOKEN as its bearer token, or a user the console lets in
    (its viewers, operators and superusers, who see every tenant's data there; the console's one
    rule, apps/console/roles.py). Nobody else, and nobody by a token when none is set."""
    expected = settings.TXHUB_METRICS_TOKEN
    if expected:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if hmac.compare_digest(given.encode(), expected.encode()):
            return True
    user = getattr(request, "user", None)
    return user is not None and roles.can_view(user)


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text format, for the token holder or a signed-in operator (may_scrape)."""
    if not may_scrape(request):
        return HttpResponse(
            "metrics token required\n",
            status=401,
            content_type="text/plain",
            headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
        )
    registry = scrape_registry(DATABASE_GAUGES)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
