"""Check-back scan cost: 1,000 due transactions among 1,000,000 pending, against 1,000 due among
1,000 pending. The claim must cost about the same (it walks the partial index on due rows).
Then a backlog: 1,000 due in one group whose cap (TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP, 2) lets two
out, with the planner held to nested loops as stale statistics choose (decision 0063): a claim
must cost about what the first one did, not grow with the square of the backlog.

Needs the local services (`make run`, or `scripts/services.sh up`). Seeds with set-based SQL into
its own producer group and topic, and deletes them afterwards.

    .venv/bin/python bench/checkback_scan.py [--pending 1000000] [--due 1000]
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from seed import seed_pending  # noqa: E402 - bench/seed.py, beside this program

from apps.broker.services import checkback, registry  # noqa: E402


def measure(pending: int, due: int, tag: str, rounds: int = 5, cap: int | None = None) -> float:
    """Median ms of one claim. With `cap`, the group's cap is that, the statistics are from
    before the seeding and the planner may use nested loops only."""
    topic = registry.topic_create(name=f"bench-scan-{tag}", queues=1)
    group = registry.producer_group_create(
        name=f"bench-scan-{tag}", check_url="https://127.0.0.1:9/"
    )
    with connection.cursor() as cursor:
        started = time.perf_counter()
        # A backlog builds faster than autovacuum analyzes: its statistics predate it.
        if cap:
            cursor.execute("ANALYZE broker_halfmessage")
        seed_pending(group=group, topic=topic, pending=pending, due=due, tag=tag)
        if not cap:
            cursor.execute("ANALYZE broker_halfmessage")
        print(
            f"  seeded {pending:,} pending ({due:,} due) in {time.perf_counter() - started:.1f} s"
        )
    timings = []
    try:
        from django.conf import settings

        settings.TXHUB_CHECK_BATCH = due
        settings.TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP = cap or due
        if cap:
            with connection.cursor() as cursor:
                cursor.execute("SET enable_hashjoin = off; SET enable_mergejoin = off")
        for _ in range(rounds):
            started = time.perf_counter()
            # With a cap: the group's own claim, as each finished check of a backlog makes one.
            claimed = checkback.checkback_claim_due(producer_group_id=group.pk if cap else None)
            timings.append((time.perf_counter() - started) * 1000)
            assert len(claimed) == (cap or due), len(claimed)
            with connection.cursor() as cursor:  # un-claim for the next round
                cursor.execute(
                    "UPDATE broker_halfmessage SET checking_until = NULL, "
                    "next_check_at = now() - interval '1 second' WHERE id = ANY(%s)",
                    [claimed],
                )
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET enable_hashjoin; RESET enable_mergejoin")
            cursor.execute(
                "DELETE FROM broker_oprecord WHERE half_id IN (SELECT id FROM "
                "broker_halfmessage WHERE producer_group_id = %s)",
                [group.pk],
            )
            cursor.execute(
                "DELETE FROM broker_halfmessage WHERE producer_group_id = %s", [group.pk]
            )
        group.delete()
        topic.delete()
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--due", type=int, default=1_000)
    args = parser.parse_args()
    tag = str(int(time.time()))
    print(f"claim of {args.due:,} due among {args.due:,} pending:")
    small = measure(args.due, args.due, tag + "s")
    print(f"  median {small:.1f} ms")
    print(f"claim of {args.due:,} due among {args.pending:,} pending:")
    large = measure(args.pending, args.due, tag + "l")
    print(f"  median {large:.1f} ms")
    print(f"ratio large/small: {large / small:.2f}")
    print(f"claim of 2 (the group's cap) from a backlog of {args.due:,} due, nested loops only:")
    backlog = measure(args.due, args.due, tag + "b", cap=2)
    print(f"  median {backlog:.1f} ms")
    print(f"ratio backlog/small: {backlog / small:.2f}")


if __name__ == "__main__":
    main()
