"""`make bench`: txhub end to end against the ceiling of the same SQL, batched, CPU, waiting
consumers, and the Django on_commit + Celery way, in one run against a running `make run`.

Prints (bench/README.md explains every line):
- pgbench running the SQL of one message (prepare, commit, receive, ack) at 4/8/16/32 clients,
- txhub single-message end to end at 4/8/16/32 producers, and `txhub / ceiling: N %`,
- `batched / ceiling: N x` (64 per request: prepare+commit batches and send batches),
- server CPU per message, single and batched, split web / Postgres / Celery (bench/cpu.py),
- a FIFO consumer group with 1,000 message groups, without groups and with one (bench/fifo.py),
- idle cost of 500 waiting consumers and commit -> waiting consumer latency (bench/long_poll.py
  when present, else bench/waiting.py),
- the same workload through Django transaction.on_commit + Celery (bench/oncommit/),
- what an unarmed failpoint costs.

    make bench                                   # one run, a few minutes
    make bench BENCH_ARGS="--runs 3"             # medians of 3 runs
    .venv/bin/python bench/produce_consume.py --concurrency 8 --seconds 5 --skip oncommit
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import cpu  # noqa: E402
from http_client import Client  # noqa: E402

BATCH = 64
# How a step that ran another bench program says it failed (the run then exits non-zero).
FAILED = "step failed: "

PGBENCH_SCRIPT = """
\\set q random(0, 3)
BEGIN;
SELECT id FROM broker_apitoken WHERE token_hash = :token_hash;
INSERT INTO broker_halfmessage (msg_id, queue_id, tags, keys, properties, body, body_is_binary,
  born_at, transaction_id, state, check_times, unreachable_checks, resolved_by,
  producer_group_id, topic_id, next_check_at)
  VALUES (upper(md5(random()::text)), :q, '', '[]', '{}', 'bench message body', false, now(),
  gen_random_uuid(), 'PREPARED', 0, 0, '', :group_id, :topic_id, now() + interval '6 seconds')
  RETURNING id AS half_id \\gset
INSERT INTO broker_oprecord (op, source, actor, reason, detail, at, half_id)
  VALUES ('PREPARE', 'PRODUCER', 'bench', '', '{}', now(), :half_id);
COMMIT;
BEGIN;
SELECT id FROM broker_apitoken WHERE token_hash = :token_hash;
SELECT msg_id, transaction_id FROM broker_halfmessage WHERE id = :half_id FOR UPDATE;
UPDATE broker_messagequeue SET next_offset = next_offset + 1
  WHERE topic_id = :topic_id AND queue_id = :q RETURNING next_offset - 1 AS qoff \\gset
INSERT INTO broker_commitlogentry (msg_id, queue_id, tags, keys, properties, body, body_is_binary,
  born_at, queue_offset, producer_group, transaction_id, stored_at, topic_id)
  SELECT msg_id, queue_id, tags, keys, properties, body, body_is_binary, born_at, :qoff,
  'bench', transaction_id, now(), topic_id FROM broker_halfmessage WHERE id = :half_id
  RETURNING "offset" AS log_offset \\gset
UPDATE broker_halfmessage SET state = 'COMMITTED', resolved_at = now(), resolved_by = 'PRODUCER'
  WHERE id = :half_id;
INSERT INTO broker_oprecord (op, source, actor, reason, detail, at, half_id)
  VALUES ('COMMIT', 'PRODUCER', 'bench', '', '{}', now(), :half_id);
COMMIT;
BEGIN;
SELECT id FROM broker_apitoken WHERE token_hash = :token_hash;
SELECT id FROM broker_consumercursor WHERE group_id = :cgroup_id AND topic_id = :topic_id
  AND queue_id = :q FOR UPDATE;
INSERT INTO broker_delivery (state, attempts, invisible_until, handle_token, first_received_at,
  last_received_at, group_id, message_id, topic_id)
  VALUES ('INFLIGHT', 1, now() + interval '60 seconds', md5(random()::text), now(), now(),
  :cgroup_id, :log_offset, :topic_id) RETURNING id AS delivery_id \\gset
UPDATE broker_consumercursor SET next_offset = GREATEST(next_offset, :qoff + 1)
  WHERE group_id = :cgroup_id AND topic_id = :topic_id AND queue_id = :q;
COMMIT;
UPDATE broker_delivery SET state = 'ACKED', acked_at = now()
  WHERE id = :delivery_id AND state = 'INFLIGHT';
"""


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")
    import django

    django.setup()


def pg_data_dir() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW data_directory")
        return os.path.realpath(str(cursor.fetchone()[0]))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def make_topic(base: str, token: str, name: str) -> None:
    s = requests.Session()
    s.headers.update({"Authorization": f"Bearer {token}"})
    s.post(f"{base}/topics", json={"name": name, "queues": 4}).raise_for_status()
    group = {"name": name, "check_url": "https://127.0.0.1:9/"}  # never called: all commit
    answer = s.post(f"{base}/producer-groups", json=group)
    assert answer.status_code == 201, answer.text
    s.post(f"{base}/consumer-groups", json={"name": name}).raise_for_status()


class NoBatchApi(Exception):
    pass


def run_load(
    base: str,
    token: str,
    name: str,
    producers: int,
    seconds: float,
    produce_one: Callable[[Client, str], int],
    data_dir: str,
    consumers: int = 2,
) -> dict[str, float]:
    """`producers` threads call produce_one until `seconds` have passed; `consumers` consumers
    receive (32 at a time, waiting up to 1 s) and ack in batches until every message produced
    is acked. The rate is messages over the time until the last ack."""
    produced = 0
    received = 0
    lock = threading.Lock()
    stop_producing = threading.Event()
    done_producing = threading.Event()
    errors: list[BaseException] = []
    last_ack = [0.0]

    def produce() -> None:
        nonlocal produced
        client = Client(base, token)
        try:
            while not stop_producing.is_set():
                n = produce_one(client, name)
                with lock:
                    produced += n
        except BaseException as error:  # reported after the run, never swallowed
            errors.append(error)
            stop_producing.set()

    def consume() -> None:
        nonlocal received
        client = Client(base, token)
        receive = {"topic": name, "max_messages": 32, "wait_seconds": 1}
        try:
            while True:
                with lock:
                    if done_producing.is_set() and received >= produced:
                        return
                batch = client.post(f"/consumer-groups/{name}/receive", receive)["messages"]
                if batch:
                    handles = [m["receipt_handle"] for m in batch]
                    client.post(f"/consumer-groups/{name}/ack", {"receipt_handles": handles})
                    with lock:
                        received += len(batch)
                        last_ack[0] = time.perf_counter()
                elif errors:
                    return
        except BaseException as error:
            errors.append(error)

    before = cpu.sample(ROOT, data_dir)
    started = time.perf_counter()
    threads = [threading.Thread(target=produce) for _ in range(producers)]
    consuming = [threading.Thread(target=consume) for _ in range(consumers)]
    for thread in [*threads, *consuming]:
        thread.start()
    time.sleep(seconds)
    stop_producing.set()
    for thread in threads:
        thread.join()
    done_producing.set()
    for thread in consuming:
        thread.join()
    # Up to the last ack, not the consumers' exit (an idle one returns from its 1 s wait later).
    elapsed = max(last_ack[0], started + seconds) - started
    spent = cpu.delta(before, cpu.sample(ROOT, data_dir))
    if errors:
        if isinstance(errors[0], NoBatchApi):
            raise errors[0]
        raise RuntimeError(f"load failed: {errors[0]!r}") from errors[0]
    total = max(produced, 1)
    return {
        "messages": produced,
        "rate": produced / elapsed,
        # Producing alone (prepare/commit or batch requests), to tell which side held the rate.
        "produce_rate": produced / seconds,
        **{f"cpu_{part}": ms / total for part, ms in spent.items()},
        "cpu_server": (spent["web"] + spent["postgres"] + spent["celery"]) / total,
    }


def single(client: Client, name: str) -> int:
    message = {"producer_group": name, "topic": name, "body": "bench message body"}
    tx = client.post("/transactions", message)
    client.post(f"/transactions/{tx['transaction_id']}/commit")
    return 1


def batched(client: Client, name: str) -> int:
    """One batched prepare + one batched commit of 64, then one batched send of 64."""
    messages = [{"body": "bench message body"} for _ in range(BATCH)]
    try:
        prepared = client.post(
            "/transactions:batch", {"producer_group": name, "topic": name, "messages": messages}
        )["results"]
    except RuntimeError as error:
        if ": 404 " in str(error) or ": 405 " in str(error):
            raise NoBatchApi() from error
        raise
    ids = [half["transaction_id"] for half in prepared]
    results = client.post("/transactions:commit", {"transaction_ids": ids})["results"]
    failed = [r for r in results if r["status"] != 200]
    assert not failed, failed[:3]
    client.post(f"/topics/{name}/messages:batch", {"producer_group": name, "messages": messages})
    return 2 * BATCH


def run_pgbench(name: str, clients: int, seconds: int, mode: str = "simple") -> float:
    from apps.broker.models import ApiToken, ConsumerCursor, ConsumerGroup, ProducerGroup, Topic

    topic = Topic.objects.get(name=name)
    # Its own consumer group: the pgbench "consumer" must not move the HTTP consumer's cursors.
    group, _ = ConsumerGroup.objects.get_or_create(name=f"{name}-pgbench")
    for queue_id in range(topic.queues):
        ConsumerCursor.objects.get_or_create(
            group=group, topic=topic, queue_id=queue_id, defaults={"next_offset": 0}
        )
    variables = {
        "topic_id": topic.pk,
        "group_id": ProducerGroup.objects.get(name=name).pk,
        "cgroup_id": group.pk,
        "token_hash": f"'{ApiToken.objects.order_by('-id').first().token_hash}'",  # type: ignore[union-attr]
    }
    from django.conf import settings

    db = settings.DATABASES["default"]  # the database the server uses (DATABASE_URL), not a guess
    pgbench = next(Path("/usr/lib/postgresql").glob("*/bin/pgbench"))
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(PGBENCH_SCRIPT)
        script.flush()
        command = [str(pgbench), "-h", db["HOST"], "-p", str(db["PORT"]), "-U", db["USER"], "-n"]
        command += ["-c", str(clients), "-j", "2", "-T", str(seconds), "-M", mode]
        command += ["-f", script.name, db["NAME"]]
        for key, value in variables.items():
            command += ["-D", f"{key}={value}"]
        # A Patroni cluster's host list (make run-ha): libpq keeps the node that takes writes.
        attrs = (db.get("OPTIONS") or {}).get("target_session_attrs")
        env = {**os.environ, **({"PGTARGETSESSIONATTRS": attrs} if attrs else {})}
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"pgbench failed:\n{result.stdout}\n{result.stderr[-2000:]}")
    match = re.search(r"tps = ([\d.]+)", result.stdout)
    if not match:
        raise RuntimeError(result.stdout)
    return float(match.group(1))


def run_waiting(url: str, token: str, consumers: int) -> list[str]:
    """bench/long_poll.py (h-async's) when it exists, else bench/waiting.py: their own lines."""
    script = ROOT / "bench" / "long_poll.py"
    if not script.exists():
        script = ROOT / "bench" / "waiting.py"
    command = [sys.executable, str(script), "--url", url, "--consumers", str(consumers)]
    env = {**os.environ, "TXHUB_BENCH_TOKEN": token}
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        return [f"{FAILED}{script.name} ({result.returncode}): {result.stderr.strip()[-400:]}"]
    return [line for line in result.stdout.splitlines() if line.strip()]


def run_program(label: str, program: str, *args: str) -> list[str]:
    """Another bench program (bench/<program>), its own lines; a failure is one FAILED line."""
    command = [sys.executable, str(ROOT / "bench" / program), *args]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return [f"{FAILED}{label} ({result.returncode}): {result.stderr.strip()[-600:]}"]
    return [line for line in result.stdout.splitlines() if line.strip()]


def run_oncommit(seconds: float, producers: int) -> list[str]:
    return run_program(
        "oncommit", "oncommit/run.py", "--seconds", str(seconds), "--producers", str(producers)
    )


def run_junk(url: str, seconds: float) -> list[str]:
    """bench/junk_tokens.py: producers alone and beside a junk-token flood."""
    return run_program("junk_tokens", "junk_tokens.py", "--url", url, "--seconds", str(seconds))


def run_fifo(url: str, seconds: float) -> list[str]:
    """bench/fifo.py: a FIFO consumer group with 1,000 message groups, none and one."""
    return run_program("fifo", "fifo.py", "--url", url, "--seconds", str(seconds))


def run_grpc(url: str, seconds: float, rpc_calls: int) -> list[str]:
    """bench/grpc_send.py: the gRPC door (official Python client) against REST."""
    return run_program(
        "grpc_send",
        "grpc_send.py",
        *("--url", url, "--seconds", str(seconds), "--rpc-calls", str(rpc_calls)),
    )


def median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=f"http://127.0.0.1:{os.environ.get('TXHUB_PORT', '8000')}")
    parser.add_argument("--runs", type=int, default=1, help="repeat and print medians")
    parser.add_argument("--concurrency", default="4,8,16,32", help="clients/producers sweep")
    parser.add_argument("--seconds", type=float, default=6, help="length of each txhub step")
    parser.add_argument("--pgbench-seconds", type=int, default=6)
    parser.add_argument("--waiting", type=int, default=500, help="waiting consumers (idle cost)")
    parser.add_argument("--rpc-calls", type=int, default=200, help="calls of each hot call")
    parser.add_argument(
        "--skip",
        default="",
        help="comma-separated: batched,fifo,grpc,junk,waiting,oncommit,failpoints",
    )
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    levels = [int(n) for n in args.concurrency.split(",")]
    setup_django()
    from apps.broker.services import registry

    try:
        requests.get(f"{args.url}/readyz", timeout=3).raise_for_status()
    except requests.RequestException:
        sys.exit(f"txhub is not running at {args.url}: start it with `make run` first.")
    data_dir = pg_data_dir()
    _, token = registry.token_create(name="bench", scopes=["admin"])
    base = f"{args.url}/api/v1"
    print(f"make bench: {args.runs} run(s), medians shown; {os.cpu_count()} CPUs (shared machine)")
    runs: list[dict[str, float]] = []
    for run in range(args.runs):
        name = f"bench-{int(time.time())}-{run}"
        make_topic(base, token, name)
        figures: dict[str, float] = {}
        for n in levels:
            figures[f"pgbench_{n}"] = run_pgbench(name, n, args.pgbench_seconds)
        best = max(levels, key=lambda n: figures[f"pgbench_{n}"])
        figures["pgbench_prepared"] = run_pgbench(name, best, args.pgbench_seconds, "prepared")
        for n in levels:
            result = run_load(base, token, name, n, args.seconds, single, data_dir)
            for key, value in result.items():
                figures[f"single_{n}_{key}"] = value
        if "batched" not in skip:
            producers = 4
            try:
                result = run_load(base, token, name, producers, args.seconds, batched, data_dir)
                for key, value in result.items():
                    figures[f"batched_{key}"] = value
            except NoBatchApi:
                figures["batched_rate"] = float("nan")
        runs.append(figures)
        print(f"  run {run + 1}/{args.runs} done", file=sys.stderr)

    def med(key: str) -> float:
        return median(runs, key)

    print(
        f"pgbench, the SQL of one message (prepare, commit, receive, ack), "
        f"{args.pgbench_seconds} s each:"
    )
    for n in levels:
        print(f"  {n:3d} clients   {med(f'pgbench_{n}'):8.1f} messages/s")
    print(
        f"  (for reference, pgbench -M prepared at its best count: "
        f"{med('pgbench_prepared'):.1f} messages/s; txhub prepares its hot statements too, "
        f"TXHUB_DB_PREPARE_THRESHOLD)"
    )
    print(
        f"txhub single messages end to end (prepare, commit, receive, ack), "
        f"{args.seconds:g} s each:"
    )
    for n in levels:
        print(
            f"  {n:3d} producers {med(f'single_{n}_rate'):8.1f} messages/s   "
            f"(produced at {med(f'single_{n}_produce_rate'):.0f}/s)   "
            f"server CPU {med(f'single_{n}_cpu_server'):6.2f} ms/message"
        )
    ceiling_n = max(levels, key=lambda n: med(f"pgbench_{n}"))
    peak_n = max(levels, key=lambda n: med(f"single_{n}_rate"))
    ceiling = med(f"pgbench_{ceiling_n}")
    peak = med(f"single_{peak_n}_rate")
    print(
        f"txhub / ceiling:      {100 * peak / ceiling:8.1f} %   "
        f"(txhub {peak:.0f}/s at {peak_n} producers over pgbench {ceiling:.0f}/s "
        f"at {ceiling_n} clients)"
    )
    if "batched" in skip:
        pass
    elif any(run["batched_rate"] != run["batched_rate"] for run in runs):
        print("batched / ceiling: n/a (no batch API on this server)")
    else:
        rate = med("batched_rate")
        print(
            f"batched / ceiling:    {rate / ceiling:8.2f} x   ({rate:.0f} messages/s, produced at "
            f"{med('batched_produce_rate'):.0f}/s, 4 producers, "
            f"{BATCH} per request: half prepare+commit batches, half send batches)"
        )

    def split(prefix: str) -> str:
        return (
            f"{med(prefix + 'cpu_server'):6.2f} ms per message (web {med(prefix + 'cpu_web'):.2f}, "
            f"postgres {med(prefix + 'cpu_postgres'):.2f}, "
            f"celery {med(prefix + 'cpu_celery'):.2f}; "
            f"whole machine minus bench {med(prefix + 'cpu_system'):.2f})"
        )

    print(f"server CPU, single at {peak_n} producers: {split(f'single_{peak_n}_')}")
    if "batched" not in skip and not any(r["batched_rate"] != r["batched_rate"] for r in runs):
        print(f"server CPU, batched:  {split('batched_')}")
    steps: list[list[str]] = []
    if "fifo" not in skip:
        steps.append(run_fifo(args.url, args.seconds))
    if "grpc" not in skip:
        steps.append(run_grpc(args.url, args.seconds, args.rpc_calls))
    if "junk" not in skip:
        steps.append(run_junk(args.url, args.seconds))
    if "oncommit" not in skip:
        steps.append(run_oncommit(args.seconds, peak_n))
    # Last: a server that holds a thread per wait stays busy with them after the bench gives up.
    if "waiting" not in skip:
        steps.append(run_waiting(args.url, token, args.waiting))
    for lines in steps:
        for line in lines:
            print(line)
    if "failpoints" not in skip:
        site_ns = unarmed_failpoint_ns()
        per_message_ns = med(f"single_{peak_n}_cpu_server") * 1e6
        share = 100 * SITES_PER_MESSAGE * site_ns / per_message_ns
        print(
            f"failpoints unarmed:   {site_ns:8.1f} ns per site, "
            f"{SITES_PER_MESSAGE} sites per message "
            f"= {share:.5f} % of the server CPU per message"
        )
    failed = [lines[0] for lines in steps if lines and lines[0].startswith(FAILED)]
    if failed:
        sys.exit(f"{len(failed)} step(s) failed: " + "; ".join(failed))


# prepare (after_half_insert), commit (after_commit_before_answer), ack (after_ack_before_answer)
SITES_PER_MESSAGE = 3


def unarmed_failpoint_ns(calls: int = 2_000_000) -> float:
    """What a failpoint site costs when TXHUB_FAILPOINTS is unset: the `if failpoints.ARMED:`
    test, timed against an empty loop (docs/decisions/0015)."""
    import timeit

    from apps.broker import failpoints

    assert not failpoints.ARMED, "unset TXHUB_FAILPOINTS to measure the unarmed cost"
    site = timeit.timeit(
        "if failpoints.ARMED: failpoints.hit('x')", globals={"failpoints": failpoints}, number=calls
    )
    empty = timeit.timeit("pass", number=calls)
    return max(0.0, site - empty) / calls * 1e9


if __name__ == "__main__":
    main()
