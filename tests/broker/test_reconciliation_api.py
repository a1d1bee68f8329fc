"""GET /api/v1/reconciliations (admin scope) and the console's Reconciliation pages."""

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.broker import tasks
from apps.broker.models import ReconciliationFinding, ReconciliationRun, RunStatus
from tests.support.console import login
from tests.support.responses import assert_error, expect


@pytest.fixture
def run(db: None) -> ReconciliationRun:
    older = ReconciliationRun.objects.create(
        day=timezone.now().date(), master="local[2]", status=RunStatus.OK
    )
    older.started_at = timezone.now() - timedelta(days=1)
    older.save()
    latest = ReconciliationRun.objects.create(
        day=timezone.now().date(),
        master="local[2]",
        status=RunStatus.FINDINGS,
        counts={"rows": {"halves": 10, "ops": 12, "log": 8}, "candidates": 2, "findings": 1},
        summary=[{"producer_group": "shop", "topic": "orders", "committed": 8}],
    )
    ReconciliationFinding.objects.create(
        run=latest,
        kind="LOST_COMMIT",
        transaction_id=uuid.UUID("00000000-0000-4000-8000-000000009527"),
        half_id=7,
        explanation="Transaction 9527 has a COMMIT op record but no commit-log row.",
    )
    return latest


def test_runs_are_listed_newest_first_for_admins(run: ReconciliationRun, api: APIClient) -> None:
    body = expect(api.get("/api/v1/reconciliations"), 200)
    assert [r["id"] for r in body["results"]][0] == run.pk
    assert body["results"][0]["status"] == "FINDINGS"
    assert body["results"][0]["counts"]["findings"] == 1


def test_a_run_shows_its_findings(run: ReconciliationRun, api: APIClient) -> None:
    body = expect(api.get(f"/api/v1/reconciliations/{run.pk}"), 200)
    assert body["findings"] == [
        {
            "kind": "LOST_COMMIT",
            "transaction_id": "00000000-0000-4000-8000-000000009527",
            "half_id": 7,
            "log_offset": None,
            "delayed_id": None,
            "explanation": "Transaction 9527 has a COMMIT op record but no commit-log row.",
        }
    ]
    missing = api.get("/api/v1/reconciliations/999999")
    assert_error(missing, 404, "not_found")


def test_reconciliations_need_the_admin_scope(
    run: ReconciliationRun, make_client: Callable[..., APIClient]
) -> None:
    producer = make_client("produce:shop")
    assert_error(producer.get("/api/v1/reconciliations"), 403, "forbidden")
    assert_error(producer.get(f"/api/v1/reconciliations/{run.pk}"), 403, "forbidden")
    assert_error(APIClient().get("/api/v1/reconciliations"), 401, "unauthenticated")


def test_the_console_lists_runs_and_links_findings_to_transactions(
    run: ReconciliationRun,
) -> None:
    vera = login("txhub-viewers", "vera")
    listing = vera.get("/console/reconciliations/").content.decode()
    assert f"/console/reconciliations/{run.pk}/" in listing
    assert "FINDINGS" in listing
    detail = vera.get(f"/console/reconciliations/{run.pk}/").content.decode()
    assert "/console/transactions/00000000-0000-4000-8000-000000009527/" in detail
    assert "no commit-log row" in detail
    overview = vera.get("/console/").content.decode()
    assert "1 finding" in overview
    assert vera.get("/console/reconciliations/999999/").status_code == 404


def test_beat_launches_the_reconciliation_every_night_at_0230(settings: Any) -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["reconcile-nightly"]
    assert entry["task"] == "apps.broker.tasks.reconcile_nightly"
    assert entry["schedule"].hour == {2}
    assert entry["schedule"].minute == {30}


def test_the_nightly_task_reconciles_yesterday_and_records_a_failure(
    transactional_db: None, settings: Any
) -> None:
    settings.TXHUB_SPARK_SUBMIT = "/bin/false"
    assert tasks.reconcile_nightly().endswith("FAILED")
    run = ReconciliationRun.objects.get()
    assert run.day == timezone.now().date() - timedelta(days=1)
    assert run.status == RunStatus.FAILED


def test_a_second_beats_nightly_task_runs_nothing_once_the_day_is_claimed(
    transactional_db: None, settings: Any
) -> None:
    # Every machine runs a beat (decision 0044): the second trigger of a night finds its run.
    settings.TXHUB_SPARK_SUBMIT = "/bin/false"
    assert tasks.reconcile_nightly().endswith("FAILED")  # a failed day may run again ...
    assert tasks.reconcile_nightly().endswith("FAILED")
    ReconciliationRun.objects.update(status=RunStatus.RUNNING)  # ... one under way may not
    assert tasks.reconcile_nightly().endswith("already run by another beat")
    assert ReconciliationRun.objects.count() == 2
