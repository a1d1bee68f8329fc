"""Django transaction.on_commit + Celery, the same workload as txhub's (an order committed, its
event published, consumed once), on txhub's Postgres and Redis: messages/s, then what is lost
when processes are killed with SIGKILL.

- rate: N producer threads for `--seconds`; messages/s = orders over the time until the worker
  has consumed every event.
- producer killed: the producer (the web process of a Django app) is SIGKILLed 5 times (by
  default, `--producer-kills`) while it runs (each kill 0.1-0.5 s after it has committed its
  first 100 orders); orders committed whose on_commit publish never reached
  Redis are orders without a consumed event once the worker has drained the queue.
- worker killed: the Celery worker is SIGKILLed 3 times (by default, `--worker-kills`) while it
  consumes, and restarted.
  Celery's default acks the task message when it starts, so the tasks it held are gone; the ones
  it had only prefetched come back after Redis's visibility timeout (an hour by default): counted
  as missing after a 10 s drain.

    .venv/bin/python bench/oncommit/run.py --seconds 6 --producers 8
"""

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ["DJANGO_SETTINGS_MODULE"] = "settings"
ENV = {**os.environ, "PYTHONPATH": str(HERE), "DJANGO_SETTINGS_MODULE": "settings"}
BIN = Path(sys.executable).parent


def create_database() -> None:
    import psycopg

    port = os.environ.get("TXHUB_PG_PORT", "54329")
    with psycopg.connect(
        f"host=127.0.0.1 port={port} user=txhub dbname=txhub", autocommit=True
    ) as conn:
        if not conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = 'txhub_oncommit'"
        ).fetchone():
            conn.execute("CREATE DATABASE txhub_oncommit")


def worker() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            str(BIN / "celery"),
            "-A",
            "celery_app",
            "-q",
            "worker",
            "--concurrency",
            "2",
            "--loglevel",
            "WARNING",
            "--without-mingle",
            "--without-gossip",
        ],
        cwd=HERE,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def producer(threads: int, seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "shop.producer", str(threads), str(seconds)],
        cwd=HERE,
        env=ENV,
        start_new_session=True,
    )


def kill(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def counts() -> tuple[int, int]:
    from shop.models import Order, Published

    return Order.objects.count(), Published.objects.count()


def drain(timeout: float, quiet: float = 2.0) -> tuple[int, int, float]:
    """Waits until every order is consumed, or nothing changed for `quiet` s, or `timeout`."""
    start = time.monotonic()
    last, changed = counts(), time.monotonic()
    while time.monotonic() - start < timeout:
        now = counts()
        if now[0] == now[1]:
            return *now, time.monotonic()
        if now != last:
            last, changed = now, time.monotonic()
        elif time.monotonic() - changed > quiet:
            break
        time.sleep(0.05)
    return *counts(), time.monotonic()


def reset() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE shop_order, shop_published")
    subprocess.run(
        [str(BIN / "celery"), "-A", "celery_app", "purge", "-f"],
        cwd=HERE,
        env=ENV,
        capture_output=True,
        check=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument(
        "--settle", type=float, default=10, help="s with nothing consumed before counting the rest"
    )
    parser.add_argument("--producer-kills", type=int, default=5)
    parser.add_argument("--worker-kills", type=int, default=3)
    args = parser.parse_args()
    create_database()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", run_syncdb=True, verbosity=0)

    # 1. Rate.
    reset()
    consumer = worker()
    time.sleep(3)  # the worker is up
    started, started_wall = time.monotonic(), time.time()
    producer(args.producers, args.seconds).wait()
    orders, published, finished = drain(timeout=120, quiet=args.settle)
    # From the first order (the producer's start-up is not the workload) to the last consumed.
    from django.db.models import Min
    from shop.models import Order

    first = Order.objects.aggregate(first=Min("created_at"))["first"].timestamp()
    rate = published / (finished - started + started_wall - first)
    print(
        f"django on_commit + celery: {rate:8.1f} messages/s ({published}/{orders} consumed, "
        f"{args.producers} producer threads, Celery prefork x2, Redis broker)"
    )

    # 2. The producer (web process) killed between commit and publish.
    reset()
    for _ in range(args.producer_kills):
        before = counts()[0]
        running = producer(args.producers, 30)
        while counts()[0] < before + 100:  # it is producing (past its start-up)
            time.sleep(0.02)
        time.sleep(random.uniform(0.1, 0.5))
        kill(running)
    orders, published, _ = drain(timeout=30, quiet=3)
    print(
        f"  producer killed {args.producer_kills}x:  {orders - published} of {orders} committed "
        "orders never published (SIGKILL after COMMIT, before on_commit reached Redis)"
    )

    # 3. The worker killed while it consumes.
    reset()
    kill(consumer)
    running = producer(args.producers, args.seconds)
    consumer = worker()
    for _ in range(args.worker_kills):
        time.sleep(random.uniform(0.5, 1.5))
        kill(consumer)
        consumer = worker()
    running.wait()
    orders, published, _ = drain(timeout=30, quiet=args.settle)
    kill(consumer)
    print(
        f"  worker killed {args.worker_kills}x:    {orders - published} of {orders} committed "
        f"orders not consumed {args.settle:g} s later (acked at start and lost, or prefetched "
        "and held for the 1 h visibility timeout)"
    )


if __name__ == "__main__":
    main()
