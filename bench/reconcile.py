"""Reconciliation speed: 1,000,000 transactions (0.1% anomalies) in local[2], then 2,000,000.

Needs the local services (`make run`, or `scripts/services.sh up`). Seeds yesterday's traffic with
set-based SQL (bench/seed.py) into its own producer group and topic, adds anomalies the same way,
runs the job in local[2] and prints rows/s and the wall time of extract, transform and load;
then removes what it seeded. Target: 1M reconciled in under 60 s on 2 cores.

    .venv/bin/python bench/reconcile.py [--sizes 1000000,2000000]
"""

import argparse
import os
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from seed import seed, unseed  # noqa: E402

from apps.broker.models import ReconciliationRun  # noqa: E402
from apps.broker.services import registry  # noqa: E402
from apps.broker.services.reconciliation import database_url  # noqa: E402
from spark_jobs.reconcile import reconcile, run_start  # noqa: E402
from spark_jobs.session import Database, build_session  # noqa: E402

# About 0.1% anomalies (rows picked at random), all through SQL the constraints allow: lost
# commits, leaked rollbacks, phantoms, state drift and stuck transactions (conflicts and
# duplicates need the unique constraints dropped; the tests cover those).
ANOMALIES = [
    # lost commits: 0.03%
    """DELETE FROM broker_commitlogentry WHERE transaction_id IN (SELECT transaction_id FROM
       broker_halfmessage WHERE producer_group_id = %(group)s AND state = 'COMMITTED'
       AND random() < 0.0003)""",
    # leaked rollbacks: 0.02%
    """INSERT INTO broker_commitlogentry (msg_id, queue_id, tags, keys, properties, body,
       body_is_binary, born_at, queue_offset, producer_group, transaction_id, stored_at, topic_id)
       SELECT upper(md5('leak' || id)), 1, '', '[]', '{}', body, false, born_at, id, 'bench',
       transaction_id, resolved_at, topic_id FROM broker_halfmessage
       WHERE producer_group_id = %(group)s AND state = 'ROLLED_BACK' AND random() < 0.002""",
    # phantoms: 0.02%
    """INSERT INTO broker_commitlogentry (msg_id, queue_id, tags, keys, properties, body,
       body_is_binary, born_at, queue_offset, producer_group, transaction_id, stored_at, topic_id)
       SELECT upper(md5('phantom' || g)), 2, '', '[]', '{}', 'x', false, %(start)s, g, 'bench',
       gen_random_uuid(), %(start)s + interval '1 hour', %(topic)s
       FROM generate_series(1, %(count)s / 5000) AS g""",
    # state drift: 0.02%
    """UPDATE broker_halfmessage SET state = 'ROLLED_BACK' WHERE producer_group_id = %(group)s
       AND state = 'COMMITTED' AND random() < 0.00024""",
    # stuck: 0.01%
    """UPDATE broker_halfmessage SET born_at = born_at - interval '10 days'
       WHERE producer_group_id = %(group)s AND state = 'PREPARED' AND random() < 0.0025""",
]


def measure(count: int, spark: SparkSession) -> None:
    tag = uuid.uuid4().hex[:8]
    topic = registry.topic_create(name=f"bench-reconcile-{tag}", queues=3)
    group = registry.producer_group_create(
        name=f"bench-reconcile-{tag}", check_url="https://127.0.0.1:9/"
    )
    day = (datetime.now(UTC) - timedelta(days=1)).date()
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    try:
        started = time.perf_counter()
        seeded = seed(
            count=count,
            group=group,
            topic=topic,
            tag=tag,
            start=start,
            spacing_ms=86_400_000 / count * 0.99,
        )
        with connection.cursor() as cursor:
            for statement in ANOMALIES:
                cursor.execute(
                    statement,
                    {"group": group.pk, "topic": topic.pk, "start": start, "count": count},
                )
            cursor.execute("VACUUM ANALYZE broker_halfmessage")
            cursor.execute("VACUUM ANALYZE broker_oprecord")
            cursor.execute("VACUUM ANALYZE broker_commitlogentry")
        print(f"\n{count:,} transactions: seeded {seeded} in {time.perf_counter() - started:.0f} s")

        db = Database.from_url(database_url())
        run_id = run_start(db, day=day, master="local[2]")
        started = time.perf_counter()
        counts = reconcile(
            spark,
            db,
            day=day,
            run_id=run_id,
            max_pending_age=72 * 3600,
            partitions=4,
            output=ROOT / "var" / "bench-reconciliation",
        )
        wall = time.perf_counter() - started
        rows = sum(counts["rows"].values())
        timings = counts["timings"]
        print(f"  rows read: {counts['rows']}")
        print(
            f"  extract {timings['extract_s']:.1f} s, transform {timings['transform_s']:.1f} s, "
            f"load {timings['recheck_s'] + timings['parquet_s']:.1f} s (re-check "
            f"{timings['recheck_s']:.1f} s, Parquet {timings['parquet_s']:.1f} s, then one "
            f"insert); wall {wall:.1f} s"
        )
        print(f"  {rows / wall:,.0f} rows/s, {count / wall:,.0f} transactions/s")
        print(f"  candidates {counts['candidates']}, findings {counts['by_kind']}")
        ReconciliationRun.objects.filter(pk=run_id).delete()
    finally:
        unseed(group=group, topic=topic)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000000,2000000")
    args = parser.parse_args()
    spark = build_session("local[2]", shuffle_partitions=8, driver_memory="6g")
    for size in (int(s) for s in args.sizes.split(",")):
        measure(size, spark)
    spark.stop()


if __name__ == "__main__":
    main()
