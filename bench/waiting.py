"""Waiting consumers: commit -> waiting consumer latency, and the idle cost of N long polls.

`make bench` runs bench/long_poll.py instead when it exists (the ASGI web tier's own script);
this one measures the same two things on any server:

- latency: one consumer waits (`wait_seconds` 5) on an empty topic; a producer commits a prepared
  message; latency = from just before the commit request to the consumer holding the message.
  It includes the commit's own round trip, so it is an upper bound.
- idle cost: N consumers long-poll (`wait_seconds` 5, again and again) an empty topic; over a
  window with no traffic, Postgres transactions/s on txhub's database (pg_stat_database: with
  autocommit every query is one) and the web tier's CPU (bench/cpu.py). Also how many of the
  waits were answered by `wait_seconds` + 1 s: a server that holds a thread per wait cannot.

    .venv/bin/python bench/waiting.py --url http://127.0.0.1:8000 --consumers 500
"""

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import cpu  # noqa: E402
from http_client import Client  # noqa: E402

WAIT = 5


def xacts() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        return int(cursor.fetchone()[0])


def latency(client: Client, name: str, samples: int) -> list[float]:
    got: list[float] = []
    errors: list[BaseException] = []
    for _ in range(samples):
        tx = client.post("/transactions", {"producer_group": name, "topic": name, "body": "x"})
        arrived: list[float] = []

        def wait(arrived: list[float] = arrived) -> None:
            consumer = Client(client_base, token)
            try:
                answer = consumer.post(
                    f"/consumer-groups/{name}/receive",
                    {"topic": name, "max_messages": 1, "wait_seconds": WAIT},
                )
                arrived.append(time.perf_counter())
                handles = [m["receipt_handle"] for m in answer["messages"]]
                if handles:
                    consumer.post(f"/consumer-groups/{name}/ack", {"receipt_handles": handles})
            except BaseException as error:  # reported below, never swallowed
                errors.append(error)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.3)  # the consumer is waiting now
        committed = time.perf_counter()
        client.post(f"/transactions/{tx['transaction_id']}/commit")
        thread.join()
        if errors:
            raise errors[0]
        got.append((arrived[0] - committed) * 1000)
    return got


def idle_cost(
    url: str, name: str, consumers: int, window: float, data_dir: str
) -> dict[str, float]:
    stop = threading.Event()
    answered_in_time = 0
    asked = 0
    lock = threading.Lock()
    host, port = url.split("//")[1].split(":")
    body = json.dumps({"topic": name, "max_messages": 1, "wait_seconds": WAIT})
    from apps.broker.services import registry

    # A token holds at most TXHUB_MAX_WAITS_PER_TOKEN waits per web process (decision 0084): the
    # consumers share a token by 32, as the consumers of several services would.
    tokens = [
        registry.token_create(name=f"bench-wait-{n}", scopes=[f"consume:{name}"])[1]
        for n in range(0, consumers, 32)
    ]

    def wait_again_and_again(token: str) -> None:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        nonlocal answered_in_time, asked
        while not stop.is_set():
            # Gives up a little after the window: a server that queues waits behind a thread
            # per wait would otherwise keep this bench for minutes.
            conn = http.client.HTTPConnection(host, int(port), timeout=WAIT + window + 3)
            t0 = time.perf_counter()
            try:
                conn.request("POST", f"/api/v1/consumer-groups/{name}/receive", body, headers)
                conn.getresponse().read()
                ok = time.perf_counter() - t0 <= WAIT + 1
            except OSError:
                ok = False
            finally:
                conn.close()
            with lock:
                asked += 1
                answered_in_time += ok

    threads = [
        threading.Thread(target=wait_again_and_again, args=(tokens[i // 32],), daemon=True)
        for i in range(consumers)
    ]
    for thread in threads:
        thread.start()
    # Every consumer is waiting, and what came before (set-up, the latency samples) has been
    # counted: a backend that goes idle reports its counts up to 10 s later (PGSTAT_IDLE_INTERVAL).
    time.sleep(12)
    q0, c0 = xacts(), cpu.sample(ROOT, data_dir)
    time.sleep(window)
    q1, c1 = xacts(), cpu.sample(ROOT, data_dir)
    stop.set()
    for thread in threads:
        thread.join()
    spent = cpu.delta(c0, c1)
    return {
        "queries_per_s": (q1 - q0 - 1) / window,  # less our own second read
        "web_cpu_percent": 100 * spent["web"] / 1000 / window,
        "postgres_cpu_percent": 100 * spent["postgres"] / 1000 / window,
        "in_time": answered_in_time,
        "asked": asked,
    }


def main() -> None:
    global client_base, token, WAIT
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=f"http://127.0.0.1:{os.environ.get('TXHUB_PORT', '8000')}")
    parser.add_argument("--consumers", type=int, default=500)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--window", type=float, default=10)
    # With 5 s each consumer asks again every 5 s, so the window holds one wave of 500 new
    # receives; with 20 (the most a receive may wait) it holds none: the cost of waiting alone.
    parser.add_argument("--wait", type=int, default=WAIT, help="wait_seconds of each receive")
    args = parser.parse_args()
    WAIT = args.wait
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")
    import django

    django.setup()
    import requests

    from apps.broker.services import registry

    token = (
        os.environ.get("TXHUB_BENCH_TOKEN")
        or registry.token_create(name="bench", scopes=["admin"])[1]
    )
    client_base = f"{args.url}/api/v1"
    name = f"wait-{int(time.time())}"
    s = requests.Session()
    s.headers.update({"Authorization": f"Bearer {token}"})
    s.post(f"{client_base}/topics", json={"name": name, "queues": 4}).raise_for_status()
    group = {"name": name, "check_url": "https://127.0.0.1:9/"}  # never called: all commit
    s.post(f"{client_base}/producer-groups", json=group).raise_for_status()
    s.post(f"{client_base}/consumer-groups", json={"name": name}).raise_for_status()
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW data_directory")
        data_dir = os.path.realpath(cursor.fetchone()[0])

    got = latency(Client(client_base, token), name, args.samples)
    p50 = statistics.median(got)
    p99 = statistics.quantiles(got, n=100)[98] if len(got) > 1 else got[0]
    print(
        f"commit -> waiting consumer: p50 {p50:.1f} ms, p99 {p99:.1f} ms "
        f"({len(got)} commits; from the commit request to the consumer holding it)"
    )
    idle = idle_cost(args.url, name, args.consumers, args.window, data_dir)
    print(
        f"idle, {args.consumers} waiting consumers (wait_seconds {WAIT}): "
        f"{idle['queries_per_s']:.0f} Postgres queries/s, "
        f"web CPU {idle['web_cpu_percent']:.0f} % of a core, Postgres CPU "
        f"{idle['postgres_cpu_percent']:.0f} %; {idle['in_time']}/{idle['asked']} waits answered "
        f"within wait_seconds + 1 s"
    )


client_base = ""
token = ""

if __name__ == "__main__":
    main()
