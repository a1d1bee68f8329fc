"""Nightly reconciliation: do the op records, half messages and commit log agree?

main() = extract (JDBC, partitioned on indexed id ranges, only the columns needed, each partition
its own short read: no transaction stays open for the run) -> pure transforms
(spark_jobs/transforms.py) -> re-check of each candidate with a point query
(spark_jobs/recheck.py) -> load (findings and the run's counts into Postgres in one transaction,
plus a Parquet copy under var/reconciliation/<date>/).

    spark-submit --jars /usr/share/java/postgresql.jar spark_jobs/reconcile.py \
        --date 2026-11-21 [--master local[2]] [--run-id N]

Days are UTC. The window is everything resolved in the day plus everything still unresolved.
"""

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from pyspark.sql import DataFrame, SparkSession

if __package__ in (None, ""):  # run as a file by spark-submit: make `spark_jobs` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_jobs import transforms  # noqa: E402
from spark_jobs.recheck import still_true  # noqa: E402
from spark_jobs.session import Database, build_session  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FETCH_SIZE = 10_000

# The window, as SQL over broker_halfmessage h; {start} / {end} are the day's bounds,
# rendered by the job from a date (never from user text).
IN_WINDOW = (
    "((h.resolved_at >= '{start}' AND h.resolved_at < '{end}')"
    " OR h.state IN ('PREPARED', 'PARKED'))"
)
HALVES_SQL = """SELECT h.id, h.transaction_id::text AS transaction_id, h.producer_group_id,
    h.topic_id, h.state, h.born_at, h.resolved_at, h.resolved_by
FROM broker_halfmessage h WHERE {window}"""
OPS_SQL = """SELECT o.id, o.half_id, h.transaction_id::text AS transaction_id, o.op, o.source, o.at
FROM broker_oprecord o JOIN broker_halfmessage h ON h.id = o.half_id
WHERE o.op IN ('COMMIT', 'ROLLBACK', 'PARK', 'RESUME') AND {window}"""
# The log in two reads with no overlap (an OR of both would defeat the indexes): rows stored in
# the day, by offset ranges; and rows of the window's transactions stored on another day (a
# delayed commit, a leaked row), through the unique index on transaction_id, by half id ranges.
LOG_IN_DAY_SQL = """SELECT l."offset" AS log_offset, l.transaction_id::text AS transaction_id,
    l.topic_id, l.stored_at
FROM broker_commitlogentry l WHERE l.stored_at >= '{start}' AND l.stored_at < '{end}'"""
LOG_BOUNDS_SQL = """SELECT min("offset"), max("offset") FROM broker_commitlogentry
WHERE stored_at >= '{start}' AND stored_at < '{end}'"""
LOG_OF_WINDOW_SQL = """SELECT h.id AS half_id, l."offset" AS log_offset,
    l.transaction_id::text AS transaction_id, l.topic_id, l.stored_at
FROM broker_halfmessage h JOIN broker_commitlogentry l ON l.transaction_id = h.transaction_id
WHERE {window} AND NOT (l.stored_at >= '{start}' AND l.stored_at < '{end}')"""
DELAYED_SQL = """SELECT d.id AS delayed_id, d.transaction_id::text AS transaction_id, d.deliver_at
FROM broker_delayedmessage d"""
GROUPS_SQL = "SELECT id AS group_id, name AS producer_group FROM broker_producergroup"
TOPICS_SQL = "SELECT id AS topic_pk, name AS topic FROM broker_topic"


def day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return start, start + timedelta(days=1)


class Extractor:
    """Reads one table at a time; each is materialized (cached) before the next one is read."""

    def __init__(self, spark: SparkSession, db: Database, partitions: int) -> None:
        self.spark, self.db, self.partitions = spark, db, partitions
        self.rows: dict[str, int] = {}

    def bounds(self, sql: str) -> tuple[int, int]:
        with psycopg.connect(self.db.conninfo, autocommit=True) as connection:
            row = connection.execute(sql).fetchone()
        low, high = row or (None, None)
        return int(low or 0), int(high or 0) + 1

    def read(
        self, name: str, sql: str, *, partition_on: tuple[str, str] | None = None
    ) -> DataFrame:
        reader = (
            self.spark.read.format("jdbc")
            .option("url", self.db.jdbc_url)
            .option("driver", "org.postgresql.Driver")
            .option("user", self.db.user)
            .option("password", self.db.password)
            .option("dbtable", f"({sql}) AS extract")
            .option("fetchsize", FETCH_SIZE)
        )
        if partition_on is not None:
            # Ranges of an indexed id column: each partition is one short indexed read.
            column, bounds_sql = partition_on
            low, high = self.bounds(bounds_sql)
            reader = (
                reader.option("partitionColumn", column)
                .option("lowerBound", low)
                .option("upperBound", high)
                .option("numPartitions", self.partitions)
            )
        frame = reader.load().cache()
        # Materialize now, so every table is read once, in this order.
        self.rows[name] = frame.count()
        return frame


def extract(
    spark: SparkSession,
    db: Database,
    *,
    day: date,
    partitions: int,
    on_extracted: Callable[[str], None] | None = None,
) -> tuple[dict[str, DataFrame], dict[str, int]]:
    """The extracted tables, and the rows read from each."""
    start, end = day_bounds(day)
    window = IN_WINDOW.format(start=start.isoformat(), end=end.isoformat())
    extractor = Extractor(spark, db, partitions)
    bounds = {"start": start.isoformat(), "end": end.isoformat()}
    half_ids = "SELECT min(id), max(id) FROM broker_halfmessage"
    plan: list[tuple[str, str, tuple[str, str] | None]] = [
        ("halves", HALVES_SQL.format(window=window), ("id", half_ids)),
        ("ops", OPS_SQL.format(window=window), ("half_id", half_ids)),
        ("log", LOG_IN_DAY_SQL.format(**bounds), ("log_offset", LOG_BOUNDS_SQL.format(**bounds))),
        ("log_of_window", LOG_OF_WINDOW_SQL.format(window=window, **bounds), ("half_id", half_ids)),
        ("delayed", DELAYED_SQL, None),
        ("groups", GROUPS_SQL, None),
        ("topics", TOPICS_SQL, None),
    ]
    frames: dict[str, DataFrame] = {}
    for name, sql, partition_on in plan:
        frames[name] = extractor.read(name, sql, partition_on=partition_on)
        if on_extracted is not None:
            on_extracted(name)  # tests change the database here, between two reads
    frames["log"] = frames["log"].unionByName(frames.pop("log_of_window").drop("half_id"))
    rows = extractor.rows
    rows["log"] += rows.pop("log_of_window")
    return frames, rows


def _collected(frame: DataFrame) -> list[dict[str, Any]]:
    """The frame's rows, brought to the driver as dicts."""
    return [row.asDict() for row in frame.collect()]


def reconcile(
    spark: SparkSession,
    db: Database,
    *,
    day: date,
    run_id: int,
    max_pending_age: float,
    partitions: int = 4,
    output: Path | None = None,
    on_extracted: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """One whole run; returns the counts it stored on the run."""
    timings: dict[str, float] = {}
    started = time.perf_counter()
    frames, rows = extract(spark, db, day=day, partitions=partitions, on_extracted=on_extracted)
    timings["extract_s"] = time.perf_counter() - started

    started = time.perf_counter()
    as_of = datetime.now(UTC)
    day_start, day_end = day_bounds(day)
    candidates = _collected(
        transforms.all_candidates(
            frames["halves"],
            frames["ops"],
            frames["log"],
            frames["delayed"],
            as_of=as_of,
            max_pending_age=max_pending_age,
        )
    )
    summary = _collected(
        transforms.summary(
            frames["halves"],
            frames["groups"],
            frames["topics"],
            day_start=day_start,
            day_end=day_end,
        )
    )
    timings["transform_s"] = time.perf_counter() - started

    started = time.perf_counter()
    findings = still_true(db.conninfo, candidates, max_pending_age=max_pending_age)
    timings["recheck_s"] = time.perf_counter() - started
    started = time.perf_counter()
    if output is not None:
        write_parquet(spark, output / day.isoformat(), findings, summary)
    timings["parquet_s"] = time.perf_counter() - started
    counts: dict[str, Any] = {
        "rows": rows,
        "candidates": len(candidates),
        "findings": len(findings),
        "by_kind": {kind: sum(f["kind"] == kind for f in findings) for kind in transforms.KINDS},
        "timings": timings,  # the final insert itself is not in them: it stores them
    }
    load(db, run_id=run_id, findings=findings, summary=summary, counts=counts)
    for frame in frames.values():
        frame.unpersist()
    return counts


def load(
    db: Database,
    *,
    run_id: int,
    findings: list[dict[str, Any]],
    summary: list[dict[str, Any]],
    counts: dict[str, Any],
) -> None:
    """Findings and the run's outcome in one transaction: a run is never half-reported."""
    status = "FINDINGS" if findings else "OK"
    with psycopg.connect(db.conninfo) as connection, connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO broker_reconciliationfinding (run_id, kind, transaction_id, half_id, "
            "log_offset, delayed_id, explanation) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [
                (
                    run_id,
                    f["kind"],
                    f["transaction_id"],
                    f["half_id"],
                    f["log_offset"],
                    f["delayed_id"],
                    f["explanation"],
                )
                for f in findings
            ],
        )
        cursor.execute(
            "UPDATE broker_reconciliationrun SET status = %s, finished_at = now(), counts = %s, "
            "summary = %s, error = '' WHERE id = %s",
            [status, json.dumps(counts), json.dumps(summary, default=str), run_id],
        )


def write_parquet(
    spark: SparkSession, folder: Path, findings: list[dict[str, Any]], summary: list[dict[str, Any]]
) -> None:
    schema = (
        "kind string, transaction_id string, half_id long, log_offset long, "
        "delayed_id long, explanation string"
    )
    spark.createDataFrame(findings, schema=schema).coalesce(1).write.mode("overwrite").parquet(
        str(folder / "findings")
    )
    summary_schema = (
        "producer_group string, topic string, committed long, rolled_back long, "
        "by_producer long, by_check_back long, by_operator long, parked long, "
        "median_ms double, p99_ms double"
    )
    spark.createDataFrame(summary, schema=summary_schema).coalesce(1).write.mode(
        "overwrite"
    ).parquet(str(folder / "summary"))


def run_start(db: Database, *, day: date, master: str) -> int:
    with psycopg.connect(db.conninfo) as connection:
        row = connection.execute(
            "INSERT INTO broker_reconciliationrun (day, master, status, started_at, counts, "
            "summary, error) VALUES (%s, %s, 'RUNNING', now(), '{}', '[]', '') RETURNING id",
            [day, master],
        ).fetchone()
    if row is None:
        raise RuntimeError("could not record the run")
    return int(row[0])


def run_failed(db: Database, *, run_id: int, error: str) -> None:
    with psycopg.connect(db.conninfo) as connection:
        connection.execute(
            "UPDATE broker_reconciliationrun SET status = 'FAILED', finished_at = now(), "
            "error = %s WHERE id = %s",
            [error[-8000:], run_id],
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    yesterday = (datetime.now(UTC) - timedelta(days=1)).date()
    parser.add_argument("--date", type=date.fromisoformat, default=yesterday)
    parser.add_argument("--master", default=os.environ.get("TXHUB_SPARK_MASTER", "local[2]"))
    parser.add_argument("--run-id", type=int)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""))
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--output", type=Path, default=ROOT / "var" / "reconciliation")
    parser.add_argument(
        "--max-pending-age",
        type=float,
        default=float(os.environ.get("TXHUB_MAX_PENDING_AGE", 72 * 3600)),
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    db = Database.from_url(args.database_url or "postgresql://txhub@127.0.0.1:54329/txhub")
    run_id = args.run_id or run_start(db, day=args.date, master=args.master)
    try:
        spark = build_session(args.master)
        counts = reconcile(
            spark,
            db,
            day=args.date,
            run_id=run_id,
            max_pending_age=args.max_pending_age,
            partitions=args.partitions,
            output=args.output,
        )
    except Exception:
        run_failed(db, run_id=run_id, error=traceback.format_exc())
        raise
    print(json.dumps({"run_id": run_id, **counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
