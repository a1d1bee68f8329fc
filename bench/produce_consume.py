"""End-to-end throughput of transactional messages over HTTP, against the ceiling of the same SQL.

Needs a running `make run` (http://127.0.0.1:8000 by default). Prints:
- end-to-end messages/s (prepare + commit by N producer threads, receive + ack by one consumer),
- prepare and commit latency p50/p99,
- server CPU milliseconds per message (gunicorn + postgres processes, from /proc),
- pgbench running the SQL of one message (prepare, commit, receive, ack) on the same Postgres,
  and txhub's rate as a share of that ceiling.

    make bench                                   # defaults
    .venv/bin/python bench/produce_consume.py --messages 4000 --producers 8
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
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from http_client import Client  # noqa: E402

PG_PORT = os.environ.get("TXHUB_PG_PORT", "54329")

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


def cpu_ms(pattern: str) -> float:
    """User + system CPU of every process whose command line matches, in milliseconds."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if not re.search(pattern, cmdline):
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except OSError:
            continue
    return total * 1000 / ticks


def server_cpu_ms() -> dict[str, float]:
    return {"web": cpu_ms(r"gunicorn"), "postgres": cpu_ms(r"^postgres")}


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def run_http(base: str, token: str, messages: int, producers: int, name: str) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {token}"}
    s = requests.Session()
    s.headers.update(headers)
    s.post(f"{base}/topics", json={"name": name, "queues": 4}).raise_for_status()
    s.post(f"{base}/producer-groups", json={"name": name, "check_url": "http://127.0.0.1:9/"})
    s.post(f"{base}/consumer-groups", json={"name": name}).raise_for_status()
    prepare_ms: list[float] = []
    commit_ms: list[float] = []
    received = 0
    lock = threading.Lock()
    per_producer = messages // producers

    def produce() -> None:
        client = Client(base, token)
        message = {"producer_group": name, "topic": name, "body": "bench message body"}
        for _ in range(per_producer):
            t0 = time.perf_counter()
            tx = client.post("/transactions", message)
            t1 = time.perf_counter()
            client.post(f"/transactions/{tx['transaction_id']}/commit")
            t2 = time.perf_counter()
            with lock:
                prepare_ms.append((t1 - t0) * 1000)
                commit_ms.append((t2 - t1) * 1000)

    def consume() -> None:
        nonlocal received
        client = Client(base, token)
        receive = {"topic": name, "max_messages": 32, "wait_seconds": 1}
        while received < per_producer * producers:
            batch = client.post(f"/consumer-groups/{name}/receive", receive)["messages"]
            if batch:
                handles = [m["receipt_handle"] for m in batch]
                client.post(f"/consumer-groups/{name}/ack", {"receipt_handles": handles})
                received += len(batch)

    cpu_before = server_cpu_ms()
    started = time.perf_counter()
    threads = [threading.Thread(target=produce) for _ in range(producers)]
    consumer = threading.Thread(target=consume)
    consumer.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    consumer.join()
    elapsed = time.perf_counter() - started
    cpu_after = server_cpu_ms()
    web_cpu = cpu_after["web"] - cpu_before["web"]
    db_cpu = cpu_after["postgres"] - cpu_before["postgres"]
    total = per_producer * producers
    return {
        "messages": total,
        "seconds": elapsed,
        "rate": total / elapsed,
        "prepare_p50": percentile(prepare_ms, 50),
        "prepare_p99": percentile(prepare_ms, 99),
        "commit_p50": percentile(commit_ms, 50),
        "commit_p99": percentile(commit_ms, 99),
        "cpu_ms_per_message": (web_cpu + db_cpu) / total,
        "web_cpu_ms_per_message": web_cpu / total,
        "db_cpu_ms_per_message": db_cpu / total,
    }


def run_pgbench(name: str, clients: int, seconds: int) -> float:
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
    pgbench = next(Path("/usr/lib/postgresql").glob("*/bin/pgbench"))
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(PGBENCH_SCRIPT)
        script.flush()
        command = [str(pgbench), "-h", "127.0.0.1", "-p", PG_PORT, "-U", "txhub", "-n"]
        command += ["-c", str(clients), "-j", "2", "-T", str(seconds), "-f", script.name, "txhub"]
        for key, value in variables.items():
            command += ["-D", f"{key}={value}"]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"pgbench failed:\n{result.stdout}\n{result.stderr[-2000:]}")
    output = result.stdout
    match = re.search(r"tps = ([\d.]+)", output)
    if not match:
        raise RuntimeError(output)
    return float(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=f"http://127.0.0.1:{os.environ.get('TXHUB_PORT', '8000')}")
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--pgbench-seconds", type=int, default=15)
    args = parser.parse_args()
    setup_django()
    from apps.broker.services import registry

    try:
        requests.get(f"{args.url}/readyz", timeout=3).raise_for_status()
    except requests.RequestException:
        sys.exit(f"txhub is not running at {args.url}: start it with `make run` first.")
    _, token = registry.token_create(name="bench", scopes=["admin"])
    name = f"bench-{int(time.time())}"
    http = run_http(f"{args.url}/api/v1", token, args.messages, args.producers, name)
    tps = run_pgbench(name, args.producers, args.pgbench_seconds)
    print(f"txhub over HTTP: {http['messages']} transactional messages, {args.producers} producers")
    print(f"  end-to-end          {http['rate']:8.1f} messages/s ({http['seconds']:.1f} s)")
    print(f"  prepare p50 / p99   {http['prepare_p50']:6.1f} / {http['prepare_p99']:6.1f} ms")
    print(f"  commit  p50 / p99   {http['commit_p50']:6.1f} / {http['commit_p99']:6.1f} ms")
    print(
        f"  server CPU          {http['cpu_ms_per_message']:8.2f} ms per message "
        f"(gunicorn {http['web_cpu_ms_per_message']:.2f}, "
        f"postgres {http['db_cpu_ms_per_message']:.2f})"
    )
    print(f"pgbench, same SQL per message, {args.producers} clients: {tps:8.1f} messages/s")
    print(f"txhub / ceiling:      {100 * http['rate'] / tps:8.1f} %")
    site_ns = unarmed_failpoint_ns()
    share = 100 * SITES_PER_MESSAGE * site_ns / (http["cpu_ms_per_message"] * 1e6)
    print(
        f"failpoints unarmed:   {site_ns:8.1f} ns per site, {SITES_PER_MESSAGE} sites per message "
        f"= {share:.5f} % of the server CPU per message"
    )


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
