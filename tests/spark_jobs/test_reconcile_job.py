"""The whole job against the real (test) Postgres over JDBC: normal traffic plus one instance of
each anomaly, written with raw SQL behind the services' back, is found exactly; transactions
resolving while the job reads are not reported; a run that cannot finish is recorded FAILED."""

import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from pyspark.sql import SparkSession

from apps.broker.models import (
    HalfMessage,
    ReconciliationFinding,
    ReconciliationRun,
    Resolver,
    RunStatus,
)
from apps.broker.services import registry, sending, transactions
from apps.broker.services.reconciliation import database_url, reconciliation_run
from apps.broker.services.sending import OutgoingMessage, message_send
from apps.broker.services.transactions import Actor
from spark_jobs.reconcile import reconcile, run_start
from spark_jobs.session import Database

PRODUCER = Actor(Resolver.PRODUCER, "shop-service")
MAX_PENDING_AGE = 3600.0
# The first test here also starts the suite's local Spark session (a JVM): seconds to minutes.
pytestmark = pytest.mark.timeout(600)


class Shop:
    def __init__(self) -> None:
        self.topic = registry.topic_create(name="orders", queues=2)
        self.group = registry.producer_group_create(
            name="shop", check_url="http://127.0.0.1:9/check"
        )
        self.n = 0

    def prepare(self, **extra: Any) -> HalfMessage:
        self.n += 1
        message = OutgoingMessage(
            producer_group="shop", body=f"order {self.n}".encode(), body_is_binary=False
        )
        return transactions.transaction_prepare(
            producer_group=self.group, topic=self.topic, message=message, actor=PRODUCER, **extra
        )

    def committed(self, **extra: Any) -> HalfMessage:
        half = self.prepare(**extra)
        transactions.transaction_commit(transaction_id=half.transaction_id, actor=PRODUCER)
        return half

    def rolled_back(self) -> HalfMessage:
        half = self.prepare()
        transactions.transaction_rollback(transaction_id=half.transaction_id, actor=PRODUCER)
        return half

    def normal_traffic(self) -> None:
        for _ in range(8):
            self.committed()
        for _ in range(3):
            self.rolled_back()
        self.prepare()  # pending, young
        parked = self.prepare()
        system = Actor(Resolver.SYSTEM, "")
        transactions.transaction_park(
            transaction_id=parked.transaction_id, actor=system, reason="t"
        )
        resumed = self.prepare()
        transactions.transaction_park(
            transaction_id=resumed.transaction_id, actor=system, reason=""
        )
        transactions.transaction_resume(transaction_id=resumed.transaction_id, actor=system)
        self.committed(delay_level=5)  # committed, waiting as a delayed message: not lost
        operator = Actor(Resolver.OPERATOR, "otto")
        by_operator = self.prepare()
        transactions.transaction_commit(
            transaction_id=by_operator.transaction_id, actor=operator, reason="checked by hand"
        )
        plain = OutgoingMessage(producer_group="shop", body=b"plain", body_is_binary=False)
        message_send(topic=self.topic, message=plain)
        message_send(
            topic=self.topic, message=plain, deliver_at=timezone.now() + timedelta(hours=1)
        )


def sql(statement: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


COPY_LOG_ROW = """
INSERT INTO broker_commitlogentry (msg_id, queue_id, tags, keys, properties, body, body_is_binary,
    born_at, queue_offset, producer_group, transaction_id, stored_at, topic_id)
SELECT upper(md5(random()::text)), h.queue_id, '', '[]', '{}', h.body, false, h.born_at,
    100000 + (random() * 1000000)::int, 'shop', %s, now(), h.topic_id
FROM broker_halfmessage h WHERE h.id = %s
"""


def inject_one_of_each(shop: Shop) -> dict[str, str]:
    """Returns kind -> the transaction id (or delayed id) it concerns."""
    lost = shop.committed()
    sql("DELETE FROM broker_commitlogentry WHERE transaction_id = %s", [lost.transaction_id])

    leaked = shop.rolled_back()
    sql(COPY_LOG_ROW, [leaked.transaction_id, leaked.pk])

    conflicting = shop.committed()
    sql(
        "INSERT INTO broker_oprecord (half_id, op, source, actor, reason, detail, at) "
        "VALUES (%s, 'ROLLBACK', 'PRODUCER', '', '', '{}', now())",
        [conflicting.pk],
    )

    duplicated = shop.committed()
    sql(COPY_LOG_ROW, [duplicated.transaction_id, duplicated.pk])

    phantom = uuid.uuid4()
    sql(COPY_LOG_ROW, [phantom, duplicated.pk])

    drifted = shop.prepare()
    sql(
        "UPDATE broker_halfmessage SET state = 'COMMITTED', resolved_at = now(), "
        "resolved_by = 'PRODUCER' WHERE id = %s",
        [drifted.pk],
    )

    stuck = shop.prepare()
    sql(
        "UPDATE broker_halfmessage SET born_at = now() - make_interval(secs => %s) WHERE id = %s",
        [MAX_PENDING_AGE + 600, stuck.pk],
    )

    plain = OutgoingMessage(producer_group="shop", body=b"late", body_is_binary=False)
    late = sending.delayed_store(
        topic_id=shop.topic.pk,
        queue_id=0,
        msg_id="LATEDELAYED0001",
        message=plain,
        deliver_at=timezone.now() + timedelta(hours=1),
        born_at=timezone.now(),
    )
    sql(
        "UPDATE broker_delayedmessage SET deliver_at = now() - interval '5 minutes' WHERE id = %s",
        [late.pk],
    )
    return {
        "LOST_COMMIT": str(lost.transaction_id),
        "LEAKED_ROLLBACK": str(leaked.transaction_id),
        "CONFLICTING_OUTCOMES": str(conflicting.transaction_id),
        "DUPLICATE_LOG_ROW": str(duplicated.transaction_id),
        "PHANTOM_LOG_ROW": str(phantom),
        "STATE_DRIFT": str(drifted.transaction_id),
        "STUCK": str(stuck.transaction_id),
        "LATE_DELAY": str(late.pk),
    }


def run_job(
    spark: SparkSession, tmp_path: Any, day: date | None = None, **hooks: Any
) -> ReconciliationRun:
    db = Database.from_url(database_url())
    day = day or timezone.now().date()
    run_id = run_start(db, day=day, master="local[2]")
    reconcile(
        spark,
        db,
        day=day,
        run_id=run_id,
        max_pending_age=MAX_PENDING_AGE,
        partitions=3,
        output=tmp_path,
        **hooks,
    )
    return ReconciliationRun.objects.get(pk=run_id)


def found(run: ReconciliationRun) -> dict[str, str]:
    return {
        f.kind: str(f.delayed_id if f.kind == "LATE_DELAY" else f.transaction_id)
        for f in run.findings.all()
    }


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
