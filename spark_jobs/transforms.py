"""Pure transforms of the reconciliation: DataFrames in, candidate findings out.

Inputs (as extracted by spark_jobs/reconcile.py, one row per database row):
  halves   id, transaction_id, producer_group_id, topic_id, state, born_at, resolved_at, resolved_by
  ops      id, half_id, transaction_id, op, source, at   (only COMMIT, ROLLBACK, PARK, RESUME)
  log      log_offset, transaction_id (null for plain sends), topic_id, stored_at
  delayed  delayed_id, transaction_id (null for plain sends), deliver_at
Every finder returns CANDIDATE_COLUMNS. A candidate is not yet a finding: rows in flight while
the job read them can look wrong, so each candidate is re-checked against the live database
before it is reported (spark_jobs/recheck.py).

No Python UDFs: everything runs in the JVM, so executors on a cluster need no Python code.
"""

from datetime import datetime

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

CANDIDATE_COLUMNS = ["kind", "transaction_id", "half_id", "log_offset", "delayed_id", "explanation"]
FINAL_OPS = ["COMMIT", "ROLLBACK"]
LATE_DELAY_SECONDS = 60

KINDS = (
    "LOST_COMMIT",
    "LEAKED_ROLLBACK",
    "CONFLICTING_OUTCOMES",
    "DUPLICATE_LOG_ROW",
    "PHANTOM_LOG_ROW",
    "STATE_DRIFT",
    "STUCK",
    "LATE_DELAY",
)


def _candidates(
    frame: DataFrame,
    kind: str,
    explanation: Column,
    *,
    transaction_id: Column | None = None,
    half_id: Column | None = None,
    log_offset: Column | None = None,
    delayed_id: Column | None = None,
) -> DataFrame:
    def given(column: Column | None, cast: str) -> Column:
        return (column if column is not None else F.lit(None)).cast(cast)

    return frame.select(
        F.lit(kind).alias("kind"),
        given(transaction_id, "string").alias("transaction_id"),
        given(half_id, "long").alias("half_id"),
        given(log_offset, "long").alias("log_offset"),
        given(delayed_id, "long").alias("delayed_id"),
        explanation.alias("explanation"),
    )


def lost_commits(ops: DataFrame, log: DataFrame, delayed: DataFrame) -> DataFrame:
    """1. A COMMIT op whose message is neither in the commit log nor waiting as delayed."""
    commits = ops.filter(F.col("op") == "COMMIT").select("half_id", "transaction_id")
    missing = commits.join(log.select("transaction_id"), "transaction_id", "left_anti").join(
        delayed.select("transaction_id"), "transaction_id", "left_anti"
    )
    return _candidates(
        missing,
        "LOST_COMMIT",
        F.format_string(
            "Transaction %s has a COMMIT op record but no commit-log row and no delayed message: "
            "the commit was lost.",
            F.col("transaction_id"),
        ),
        transaction_id=F.col("transaction_id"),
        half_id=F.col("half_id"),
    )


def leaked_rollbacks(ops: DataFrame, log: DataFrame) -> DataFrame:
    """2. A ROLLBACK op whose message reached the commit log anyway.

    Not when the transaction has a COMMIT op too: that is a conflict (3), reported as such.
    """
    commits = ops.filter(F.col("op") == "COMMIT").select("transaction_id")
    rollbacks = (
        ops.filter(F.col("op") == "ROLLBACK")
        .select("half_id", "transaction_id")
        .join(commits, "transaction_id", "left_anti")
    )
    leaked = (
        rollbacks.join(log.select("transaction_id", "log_offset"), "transaction_id")
        .groupBy("half_id", "transaction_id")
        .agg(F.min("log_offset").alias("log_offset"))  # one finding per transaction
    )
    return _candidates(
        leaked,
        "LEAKED_ROLLBACK",
        F.format_string(
            "Transaction %s was rolled back, yet its message is in the commit log at offset %d.",
            F.col("transaction_id"),
            F.col("log_offset"),
        ),
        transaction_id=F.col("transaction_id"),
        half_id=F.col("half_id"),
        log_offset=F.col("log_offset"),
    )


def conflicting_outcomes(ops: DataFrame) -> DataFrame:
    """3. More than one final op (COMMIT or ROLLBACK) for one transaction."""
    finals = (
        ops.filter(F.col("op").isin(FINAL_OPS))
        .groupBy("half_id", "transaction_id")
        .agg(F.count("*").alias("n"), F.sort_array(F.collect_list("op")).alias("outcomes"))
        .filter(F.col("n") > 1)
    )
    return _candidates(
        finals,
        "CONFLICTING_OUTCOMES",
        F.format_string(
            "Transaction %s has %d final op records (%s); exactly one is allowed.",
            F.col("transaction_id"),
            F.col("n"),
            F.concat_ws(", ", F.col("outcomes")),
        ),
        transaction_id=F.col("transaction_id"),
        half_id=F.col("half_id"),
    )


def duplicate_log_rows(log: DataFrame) -> DataFrame:
    """4. More than one commit-log row for one transaction."""
    duplicates = (
        log.filter(F.col("transaction_id").isNotNull())
        .groupBy("transaction_id")
        .agg(
            F.count("*").alias("n"),
            F.min("log_offset").alias("first_offset"),
            F.sort_array(F.collect_list("log_offset")).alias("offsets"),
        )
        .filter(F.col("n") > 1)
    )
    return _candidates(
        duplicates,
        "DUPLICATE_LOG_ROW",
        F.format_string(
            "Transaction %s is in the commit log %d times (offsets %s); it must be there once.",
            F.col("transaction_id"),
            F.col("n"),
            F.concat_ws(", ", F.col("offsets").cast("array<string>")),
        ),
        transaction_id=F.col("transaction_id"),
        log_offset=F.col("first_offset"),
    )


def phantom_log_rows(ops: DataFrame, log: DataFrame) -> DataFrame:
    """5. A commit-log row from a transaction that has no COMMIT op.

    One with a ROLLBACK op instead is a leaked rollback (2) and is reported as that alone.
    """
    finals = ops.filter(F.col("op").isin(FINAL_OPS)).select("transaction_id")
    phantoms = log.filter(F.col("transaction_id").isNotNull()).join(
        finals, "transaction_id", "left_anti"
    )
    return _candidates(
        phantoms,
        "PHANTOM_LOG_ROW",
        F.format_string(
            "Commit-log row at offset %d belongs to transaction %s, which has no COMMIT op record.",
            F.col("log_offset"),
            F.col("transaction_id"),
        ),
        transaction_id=F.col("transaction_id"),
        log_offset=F.col("log_offset"),
    )


def expected_states(ops: DataFrame) -> DataFrame:
    """The state each half message's op records say it is in: half_id, expected."""
    final = (
        ops.filter(F.col("op").isin(FINAL_OPS))
        .groupBy("half_id")
        # With conflicting outcomes (3) either is "expected"; that finding reports the conflict.
        .agg(
            F.min(F.when(F.col("op") == "COMMIT", "COMMITTED").otherwise("ROLLED_BACK")).alias("f")
        )
    )
    parking = (
        ops.filter(F.col("op").isin("PARK", "RESUME"))
        .groupBy("half_id")
        .agg(F.max_by("op", F.struct("at", "id")).alias("last"))
        .select(
            "half_id", F.when(F.col("last") == "PARK", "PARKED").otherwise("PREPARED").alias("p")
        )
    )
    return final.join(parking, "half_id", "full").select(
        "half_id", F.coalesce("f", "p").alias("expected")
    )


def state_drift(halves: DataFrame, ops: DataFrame) -> DataFrame:
    """6. A half message whose state is not what its op records say."""
    expected = halves.select(F.col("id").alias("half_id"), "transaction_id", "state").join(
        expected_states(ops), "half_id", "left"
    )
    drifted = expected.withColumn("expected", F.coalesce("expected", F.lit("PREPARED"))).filter(
        F.col("state") != F.col("expected")
    )
    return _candidates(
        drifted,
        "STATE_DRIFT",
        F.format_string(
            "Transaction %s is %s, but its op records say %s.",
            F.col("transaction_id"),
            F.col("state"),
            F.col("expected"),
        ),
        transaction_id=F.col("transaction_id"),
        half_id=F.col("half_id"),
    )


def stuck(halves: DataFrame, *, as_of: datetime, max_pending_age: float) -> DataFrame:
    """7. Unresolved for longer than TXHUB_MAX_PENDING_AGE and still not parked."""
    limit = F.lit(as_of).cast("timestamp") - F.make_dt_interval(secs=F.lit(max_pending_age))
    old = halves.filter((F.col("state") == "PREPARED") & (F.col("born_at") < limit))
    return _candidates(
        old,
        "STUCK",
        F.format_string(
            "Transaction %s has been PREPARED since %s, longer than TXHUB_MAX_PENDING_AGE "
            "(%s s), and was not parked.",
            F.col("transaction_id"),
            F.date_format("born_at", "yyyy-MM-dd HH:mm:ss"),
            F.lit(f"{max_pending_age:g}"),
        ),
        transaction_id=F.col("transaction_id"),
        half_id=F.col("id"),
    )


def late_delays(delayed: DataFrame, *, as_of: datetime) -> DataFrame:
    """8. A delayed message still waiting more than a minute after it was due."""
    limit = F.lit(as_of).cast("timestamp") - F.expr(f"INTERVAL {LATE_DELAY_SECONDS} SECONDS")
    late = delayed.filter(F.col("deliver_at") < limit)
    return _candidates(
        late,
        "LATE_DELAY",
        F.format_string(
            "Delayed message %d was due at %s and is still not delivered.",
            F.col("delayed_id"),
            F.date_format("deliver_at", "yyyy-MM-dd HH:mm:ss"),
        ),
        transaction_id=F.col("transaction_id"),
        delayed_id=F.col("delayed_id"),
    )


def all_candidates(
    halves: DataFrame,
    ops: DataFrame,
    log: DataFrame,
    delayed: DataFrame,
    *,
    as_of: datetime,
    max_pending_age: float,
) -> DataFrame:
    found = [
        lost_commits(ops, log, delayed),
        leaked_rollbacks(ops, log),
        conflicting_outcomes(ops),
        duplicate_log_rows(log),
        phantom_log_rows(ops, log),
        state_drift(halves, ops),
        stuck(halves, as_of=as_of, max_pending_age=max_pending_age),
        late_delays(delayed, as_of=as_of),
    ]
    union = found[0]
    for frame in found[1:]:
        union = union.unionByName(frame)
    return union


def summary(
    halves: DataFrame,
    groups: DataFrame,
    topics: DataFrame,
    *,
    day_start: datetime,
    day_end: datetime,
) -> DataFrame:
    """Per producer group and topic: outcomes of the day, who resolved them, time to resolution."""
    in_day = (F.col("resolved_at") >= F.lit(day_start).cast("timestamp")) & (
        F.col("resolved_at") < F.lit(day_end).cast("timestamp")
    )
    millis = (F.unix_micros("resolved_at") - F.unix_micros("born_at")) / 1000.0

    def count_if(condition: Column) -> Column:
        return F.sum(F.when(condition, 1).otherwise(0)).cast("long")

    return (
        halves.join(groups, halves.producer_group_id == groups.group_id)
        .join(topics, halves.topic_id == topics.topic_pk)
        .groupBy("producer_group", "topic")
        .agg(
            count_if(in_day & (F.col("state") == "COMMITTED")).alias("committed"),
            count_if(in_day & (F.col("state") == "ROLLED_BACK")).alias("rolled_back"),
            count_if(in_day & (F.col("resolved_by") == "PRODUCER")).alias("by_producer"),
            count_if(in_day & (F.col("resolved_by") == "CHECK_BACK")).alias("by_check_back"),
            count_if(in_day & (F.col("resolved_by") == "OPERATOR")).alias("by_operator"),
            count_if(F.col("state") == "PARKED").alias("parked"),
            F.percentile_approx(F.when(in_day, millis), 0.5).alias("median_ms"),
            F.percentile_approx(F.when(in_day, millis), 0.99).alias("p99_ms"),
        )
        .orderBy("producer_group", "topic")
    )
