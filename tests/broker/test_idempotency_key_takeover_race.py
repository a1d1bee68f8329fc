"""Two retries taking over one expired Idempotency-Key at once (services/idempotency.py,
decision 0016): the key's row is locked before its age is read, so the second waits for the
first's commit, finds the key fresh and answers the first's answer. Without the lock both read it
expired and both store (mutation 34 of decision 0093). The first retry stops before its store (at
the `after_idempotency_key_read` failpoint, decision 0098) until the second waits for a lock it
holds or has answered. Real concurrent transactions, each on its own connection; the second's
exception reaches the test through its future."""

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.broker import failpoints
from apps.broker.models import CommitLogEntry, IdempotencyKey
from tests.conftest import client_for
from tests.support.own_connection import in_thread
from tests.support.statement_faults import own_connection

pytestmark = pytest.mark.django_db(transaction=True)

SEND = "/api/v1/topics/orders/messages"
MESSAGE = {"producer_group": "order-service", "body": "order 9527 created"}
KEY = "order-9527"
BOUND = 10  # seconds a step may take (a bound, not a measurement)


def waits_for(pid: int) -> bool:
    """Some session waits for a lock the session `pid` holds (seen from a session of the
    test's own: a transaction sees one snapshot of pg_stat_activity)."""
    with own_connection(autocommit=True) as watcher:
        return bool(
            watcher.execute(
                "SELECT 1 FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", [pid]
            ).fetchall()
        )


def send() -> Any:
    """The producer's send with the key, through the REST door (the test client's response)."""
    producer = client_for("produce:order-service", name="producer")
    return producer.post(SEND, MESSAGE, format="json", HTTP_IDEMPOTENCY_KEY=KEY)


def test_two_retries_taking_over_an_expired_key_store_once(setup_topic: Any) -> None:
    setup_topic()
    first = send()
    assert first.status_code == 201, first.json()
    old = timezone.now() - timedelta(seconds=settings.TXHUB_IDEMPOTENCY_TTL + 1)
    assert IdempotencyKey.objects.update(created_at=old) == 1
    taking_over = threading.get_ident()
    second: list[Any] = []

    def the_other_retry_meanwhile() -> None:
        # The first retry has read its key row (and locked it) as expired; it stores next.
        if threading.get_ident() != taking_over:
            return  # the other retry passes the site straight on, if it gets there
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            [(pid,)] = cursor.fetchall()
        other = in_thread(send)
        second.append(other)
        deadline = time.monotonic() + BOUND
        while not (other.done() or waits_for(pid)):
            assert time.monotonic() < deadline, "the other retry neither waited nor answered"
            time.sleep(0.02)

    with failpoints.armed_here("after_idempotency_key_read", the_other_retry_meanwhile):
        retried = send()
    [other] = second
    racing = other.result(timeout=BOUND)
    assert (retried.status_code, racing.status_code) == (201, 201), racing.json()
    assert "Idempotent-Replayed" not in retried
    assert racing["Idempotent-Replayed"] == "true"
    assert racing.json() == retried.json()
    assert retried.json()["msg_id"] != first.json()["msg_id"]
    assert CommitLogEntry.objects.count() == 2  # the first send and one takeover
