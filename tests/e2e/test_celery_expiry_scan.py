"""Celery beat + worker, real processes: the expiry scan dead-letters a message whose attempts
are used up even when no consumer receives from the group any more."""

import time
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from apps.broker.models import Delivery

pytestmark = pytest.mark.e2e


def test_beat_and_worker_move_an_exhausted_message_to_the_dlq(
    celery_processes: None, api: APIClient, setup_topic: Any
) -> None:
    setup_topic(max_delivery_attempts=1)
    sent = api.post(
        "/api/v1/topics/orders/messages",
        {"producer_group": "order-service", "body": "x"},
        format="json",
    )
    assert sent.status_code == 201, sent.json()
    response = api.post(
        "/api/v1/consumer-groups/billing/receive", {"topic": "orders"}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert len(response.json()["messages"]) == 1
    with connection.cursor() as cursor:  # its invisible time passes, and nobody receives again
        cursor.execute("UPDATE broker_delivery SET invisible_until = now() - interval '1 second'")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Delivery.objects.get().state != "DLQ":
        time.sleep(0.3)
    assert Delivery.objects.get().state == "DLQ"


CELERY_APP = "txhub-celery-test"


def test_scans_reuse_their_workers_database_connections(start_celery: Any) -> None:
    # Celery's Django fixup used to close every connection (and, in a prefork worker, Django's
    # pool) around each task: each scan, several a second, started a new Postgres backend.
    # Now a task gives its connection back to its process's pool (txhub/celery.py).
    from tests.conftest import db_url_for_tests

    start_celery(DATABASE_URL=f"{db_url_for_tests()}?application_name={CELERY_APP}")
    time.sleep(3)  # scans every 0.5 s (FAST): every scan process has run one by now
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        [(window_start,)] = cursor.fetchall()
    started: set[int] = set()
    deadline = time.monotonic() + 8  # ~50 more scans
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
                "AND backend_start > %s",
                [CELERY_APP, window_start],
            )
            started |= {row[0] for row in cursor.fetchall()}
        time.sleep(0.05)
    # At most a process's first connection (one that had not run a task yet); a backend per task
    # shows here as dozens.
    assert len(started) <= 4, f"{len(started)} Postgres backends started during ~50 scans"
