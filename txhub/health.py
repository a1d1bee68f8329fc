"""Liveness and readiness probes (plain JSON, no auth) and the Prometheus scrape endpoint."""

import hmac

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from apps.broker.metrics import scrape_registry


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
        redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=2).ping()
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
    return HttpResponse(generate_latest(scrape_registry()), content_type=CONTENT_TYPE_LATEST)
