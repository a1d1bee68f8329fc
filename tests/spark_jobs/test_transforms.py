"""Each reconciliation transform on tiny DataFrames (pyspark.testing.assertDataFrameEqual)."""

from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from spark_jobs import transforms

HALVES = (
    "id long, transaction_id string, producer_group_id long, topic_id long, state string, "
    "born_at timestamp, resolved_at timestamp, resolved_by string"
)
OPS = "id long, half_id long, transaction_id string, op string, source string, at timestamp"
LOG = "log_offset long, transaction_id string, topic_id long, stored_at timestamp"
DELAYED = "delayed_id long, transaction_id string, deliver_at timestamp"
CANDIDATES = (
    "kind string, transaction_id string, half_id long, log_offset long, delayed_id long, "
    "explanation string"
)
T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def frames(spark: SparkSession) -> dict[str, DataFrame]:
    # Groups (10 shop, 20 billing) and topics (30 orders, 40 refunds) have ids no other table
    # shares, and transactions spread over all four pairs: a join on the wrong key finds nothing
    # or the wrong pair (the summary test).
    halves = [
        (1, "t1", 10, 30, "COMMITTED", at(0), at(1), "PRODUCER"),  # fine
        (2, "t2", 10, 30, "COMMITTED", at(0), at(2), "CHECK_BACK"),  # lost commit
        (3, "t3", 10, 40, "ROLLED_BACK", at(0), at(3), "PRODUCER"),  # leaked rollback
        (4, "t4", 20, 30, "COMMITTED", at(0), at(4), "OPERATOR"),  # conflicting, duplicate
        (5, "t5", 20, 30, "PREPARED", at(0), None, ""),  # drift: has a COMMIT op (and log row)
        (6, "t6", 20, 40, "PARKED", at(0), None, ""),  # fine: parked, then PARK op
        (7, "t7", 10, 30, "PARKED", at(0), None, ""),  # drift: resumed after the park
        (8, "t8", 20, 40, "PREPARED", at(-400_000), None, ""),  # stuck
        (9, "t9", 20, 40, "COMMITTED", at(0), at(5), "PRODUCER"),  # fine: delayed, waiting
    ]
    ops = [
        (11, 1, "t1", "COMMIT", "PRODUCER", at(1)),
        (12, 2, "t2", "COMMIT", "CHECK_BACK", at(2)),
        (13, 3, "t3", "ROLLBACK", "PRODUCER", at(3)),
        (14, 4, "t4", "COMMIT", "OPERATOR", at(4)),
        (15, 4, "t4", "ROLLBACK", "PRODUCER", at(4)),
        (16, 5, "t5", "COMMIT", "PRODUCER", at(5)),
        (17, 6, "t6", "PARK", "SYSTEM", at(6)),
        (18, 7, "t7", "PARK", "SYSTEM", at(6)),
        (19, 7, "t7", "RESUME", "OPERATOR", at(7)),
        (20, 9, "t9", "COMMIT", "PRODUCER", at(5)),
    ]
    log = [
        (100, "t1", 30, at(1)),
        (101, "t3", 40, at(3)),
        (102, "t4", 30, at(4)),
        (103, "t4", 30, at(4)),
        (104, "t5", 30, at(5)),
        (105, "t-phantom", 30, at(5)),
        (106, None, 30, at(5)),  # a plain send: no transaction, never a phantom
    ]
    delayed = [
        (200, "t9", at(60)),  # due later: fine
        (201, None, at(-120)),  # a plain send two minutes overdue: late
        (202, None, at(-30)),  # overdue by 30 s: not yet late
    ]
    return {
        "halves": spark.createDataFrame(halves, HALVES),
        "ops": spark.createDataFrame(ops, OPS),
        "log": spark.createDataFrame(log, LOG),
        "delayed": spark.createDataFrame(delayed, DELAYED),
    }


def kinds_and_keys(frame: DataFrame) -> DataFrame:
    return frame.select("kind", "transaction_id", "half_id", "log_offset", "delayed_id")


def expected(spark: SparkSession, rows: list[tuple[object, ...]]) -> DataFrame:
    schema = "kind string, transaction_id string, half_id long, log_offset long, delayed_id long"
    return spark.createDataFrame(rows, schema)


def test_lost_commit_is_a_commit_op_with_no_log_row_and_no_delayed_message(
    spark: SparkSession, frames: dict[str, DataFrame]
) -> None:
    found = transforms.lost_commits(frames["ops"], frames["log"], frames["delayed"])
    assertDataFrameEqual(
        kinds_and_keys(found), expected(spark, [("LOST_COMMIT", "t2", 2, None, None)])
    )
    assert "no commit-log row" in found.first()["explanation"]  # type: ignore[index]


def test_leaked_rollback_is_a_rollback_op_with_a_log_row(
    spark: SparkSession, frames: dict[str, DataFrame]
) -> None:
    found = transforms.leaked_rollbacks(frames["ops"], frames["log"])
    assertDataFrameEqual(
        kinds_and_keys(found),
        expected(
            spark,
            [
                # Not t4: it has a COMMIT op too, which is a conflict, reported as one.
                ("LEAKED_ROLLBACK", "t3", 3, 101, None),
            ],
        ),
    )


def test_conflicting_outcomes_are_two_final_ops_for_one_transaction(
    spark: SparkSession, frames: dict[str, DataFrame]
) -> None:
    found = transforms.conflicting_outcomes(frames["ops"])
    assertDataFrameEqual(
        found,
        spark.createDataFrame(
            [
                (
                    "CONFLICTING_OUTCOMES",
                    "t4",
                    4,
                    None,
                    None,
                    "Transaction t4 has 2 final op records (COMMIT, ROLLBACK); exactly one is "
                    "allowed.",
                )
            ],
            CANDIDATES,
        ),
    )


def test_duplicate_log_rows_are_two_rows_for_one_transaction(
    spark: SparkSession, frames: dict[str, DataFrame]
) -> None:
    found = transforms.duplicate_log_rows(frames["log"])
    assertDataFrameEqual(
        kinds_and_keys(found), expected(spark, [("DUPLICATE_LOG_ROW", "t4", None, 102, None)])
    )
    assert "offsets 102, 103" in found.first()["explanation"]  # type: ignore[index]


def test_a_phantom_is_a_log_row_whose_transaction_has_no_commit_op(
    spark: SparkSession, frames: dict[str, DataFrame]
) -> None:
    found = transforms.phantom_log_rows(frames["ops"], frames["log"])
    assertDataFrameEqual(
        kinds_and_keys(found),
        expected(
            spark,
            [
                # Not t3: its row is a leaked rollback, reported as that alone.
                ("PHANTOM_LOG_ROW", "t-phantom", None, 105, None),
            ],
        ),
    )


def test_state_drift_compares_the_state_with_what_the_ops_say(
    spark: SparkSession, frames: dict[str, DataFrame]
) -> None:
    found = transforms.state_drift(frames["halves"], frames["ops"])
    assertDataFrameEqual(
        kinds_and_keys(found),
        expected(
            spark,
            [("STATE_DRIFT", "t5", 5, None, None), ("STATE_DRIFT", "t7", 7, None, None)],
        ),
    )
    explanations = sorted(row["explanation"] for row in found.collect())
    assert explanations[0] == "Transaction t5 is PREPARED, but its op records say COMMITTED."
    assert explanations[1] == "Transaction t7 is PARKED, but its op records say PREPARED."


def test_stuck_is_prepared_beyond_the_max_pending_age_and_not_parked(
    spark: SparkSession, frames: dict[str, DataFrame]
) -> None:
    found = transforms.stuck(frames["halves"], as_of=T0, max_pending_age=72 * 3600)
    assertDataFrameEqual(kinds_and_keys(found), expected(spark, [("STUCK", "t8", 8, None, None)]))
    none = transforms.stuck(frames["halves"], as_of=T0, max_pending_age=500_000)
    assert none.count() == 0


def test_a_delayed_message_is_late_a_minute_after_it_was_due(
    spark: SparkSession, frames: dict[str, DataFrame]
) -> None:
    found = transforms.late_delays(frames["delayed"], as_of=T0)
    assertDataFrameEqual(
        kinds_and_keys(found), expected(spark, [("LATE_DELAY", None, None, None, 201)])
    )


def test_all_candidates_is_the_union_of_every_finder(
    spark: SparkSession, frames: dict[str, DataFrame]
) -> None:
    found = transforms.all_candidates(
        frames["halves"],
        frames["ops"],
        frames["log"],
        frames["delayed"],
        as_of=T0,
        max_pending_age=72 * 3600,
    )
    counts = {row["kind"]: row["count"] for row in found.groupBy("kind").count().collect()}
    assert counts == {
        "LOST_COMMIT": 1,
        "LEAKED_ROLLBACK": 1,
        "CONFLICTING_OUTCOMES": 1,
        "DUPLICATE_LOG_ROW": 1,
        "PHANTOM_LOG_ROW": 1,
        "STATE_DRIFT": 2,
        "STUCK": 1,
        "LATE_DELAY": 1,
    }


def test_summary_counts_outcomes_resolvers_and_time_to_resolution(
    spark: SparkSession, frames: dict[str, DataFrame]
) -> None:
    groups = spark.createDataFrame(
        [(10, "shop"), (20, "billing")], "group_id long, producer_group string"
    )
    topics = spark.createDataFrame([(30, "orders"), (40, "refunds")], "topic_pk long, topic string")
    found = transforms.summary(
        frames["halves"],
        groups,
        topics,
        day_start=datetime(2026, 11, 21, tzinfo=UTC),
        day_end=datetime(2026, 11, 22, tzinfo=UTC),
    )
    # Resolved in the day: t1 (1 s), t2 (2 s), t3 (3 s), t4 (4 s), t9 (5 s); parked: t6, t7.
    assertDataFrameEqual(
        found,
        spark.createDataFrame(
            [
                ("billing", "orders", 1, 0, 0, 0, 1, 0, 4000.0, 4000.0),  # t4, t5
                ("billing", "refunds", 1, 0, 1, 0, 0, 1, 5000.0, 5000.0),  # t6, t8, t9
                ("shop", "orders", 2, 0, 1, 1, 0, 1, 1000.0, 2000.0),  # t1, t2, t7
                ("shop", "refunds", 0, 1, 1, 0, 0, 0, 3000.0, 3000.0),  # t3
            ],
            "producer_group string, topic string, committed long, rolled_back long, "
            "by_producer long, by_check_back long, by_operator long, parked long, "
            "median_ms double, p99_ms double",
        ),
        checkRowOrder=True,
    )
