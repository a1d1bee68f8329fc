"""The whole job against the real (test) Postgres over JDBC: normal traffic plus one instance of
each anomaly, written with raw SQL behind the services' back, is found exactly; transactions
resolving while the job reads are not reported; a run that cannot finish is recorded FAILED."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone
from pyspark.sql import SparkSession

from apps.broker.models import ReconciliationFinding, RunStatus
from apps.broker.services import transactions
from apps.broker.services.reconciliation import reconciliation_run
from tests.support.reconciliation import (
    PRODUCER,
    Shop,
    found,
    inject_one_of_each,
    run_job,
    sql,
)

# The first test here also starts the suite's local Spark session (a JVM): seconds to minutes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_one_of_each_anomaly_is_found_and_nothing_else(
    unconstrained: None, spark: SparkSession, tmp_path: Any
) -> None:
    shop = Shop()
    shop.normal_traffic()
    injected = inject_one_of_each(shop)
    shop.normal_traffic()  # more after, so the anomalies are not at the edges of id ranges

    run = run_job(spark, tmp_path)

    assert run.status == RunStatus.FINDINGS
    assert found(run) == injected
    assert run.findings.count() == 8  # exactly one of each
    for finding in run.findings.all():
        assert finding.explanation.startswith(("Transaction", "Commit-log", "Delayed"))
    assert run.counts["by_kind"] == dict.fromkeys(injected, 1)
    summary = {(row["producer_group"], row["topic"]): row for row in run.summary}
    shop_orders = summary[("shop", "orders")]
    # Committed in the day: 2 x (8 + delayed + operator) + lost + conflicting + duplicated and
    # the drifted one (its state says COMMITTED).
    assert shop_orders["committed"] == 2 * 10 + 4
    assert shop_orders["rolled_back"] == 2 * 3 + 1
    assert shop_orders["by_operator"] == 2
    assert shop_orders["parked"] == 2
    assert shop_orders["median_ms"] is not None
    parquet = spark.read.parquet(str(tmp_path / run.day.isoformat() / "findings"))
    assert parquet.count() == 8


def test_a_clean_database_gives_an_ok_run(
    transactional_db: None, spark: SparkSession, tmp_path: Any
) -> None:
    Shop().normal_traffic()
    run = run_job(spark, tmp_path)
    assert run.status == RunStatus.OK
    assert not run.findings.exists()
    assert run.counts["rows"]["halves"] > 0


def test_transactions_resolving_while_the_job_reads_are_not_reported(
    transactional_db: None, spark: SparkSession, tmp_path: Any
) -> None:
    shop = Shop()
    shop.normal_traffic()
    in_flight = [shop.prepare() for _ in range(3)]

    def resolve_between_reads(table: str) -> None:
        # After the halves are read, one commits (its COMMIT op and log row are read later);
        # after the ops are read, another commits (its log row is read, its op is not); after
        # the log is read, a third commits (its op... was already read without it).
        index = {"halves": 0, "ops": 1, "log": 2}.get(table)
        if index is not None:
            transactions.transaction_commit(
                transaction_id=in_flight[index].transaction_id, actor=PRODUCER
            )

    run = run_job(spark, tmp_path, on_extracted=resolve_between_reads)

    assert run.counts["candidates"] >= 2  # the reads did disagree...
    assert run.status == RunStatus.OK  # ...and the re-check dropped every one
    assert not run.findings.exists()


def test_a_run_that_cannot_finish_is_recorded_as_failed(
    transactional_db: None, settings: Any
) -> None:
    settings.TXHUB_SPARK_SUBMIT = "/bin/false"
    run = reconciliation_run(day=timezone.now().date(), master="local[2]")
    assert run.status == RunStatus.FAILED
    assert "exited with 1" in run.error
    assert run.finished_at is not None
    assert ReconciliationFinding.objects.count() == 0


def test_a_commit_across_midnight_is_found_in_neither_day(
    transactional_db: None, spark: SparkSession, tmp_path: Any
) -> None:
    """Committed at 23:59:59.9 (its op and state), its log row stored at 00:00:00.1: each day's
    run reads one side of it, and neither reports it."""
    shop = Shop()
    shop.normal_traffic()
    half = shop.committed()
    today = timezone.now().date()
    midnight = datetime(today.year, today.month, today.day, tzinfo=UTC)
    before, after = midnight - timedelta(milliseconds=100), midnight + timedelta(milliseconds=100)
    sql(
        "UPDATE broker_halfmessage SET born_at = %s, resolved_at = %s WHERE id = %s",
        [before - timedelta(seconds=1), before, half.pk],
    )
    sql("UPDATE broker_oprecord SET at = %s WHERE half_id = %s", [before, half.pk])
    sql(
        "UPDATE broker_commitlogentry SET stored_at = %s WHERE transaction_id = %s",
        [after, half.transaction_id],
    )
    runs = [run_job(spark, tmp_path, day=day) for day in (today - timedelta(days=1), today)]
    for run in runs:
        assert run.status == RunStatus.OK, (run.day, found(run))
    yesterday = {(row["producer_group"], row["topic"]): row for row in runs[0].summary}
    assert yesterday[("shop", "orders")]["committed"] == 1  # the positive control: it was read
    # The positive control for the finding: without its log row it is a lost commit.
    sql("DELETE FROM broker_commitlogentry WHERE transaction_id = %s", [half.transaction_id])
    lost = run_job(spark, tmp_path, day=today - timedelta(days=1))
    assert found(lost) == {"LOST_COMMIT": str(half.transaction_id)}
