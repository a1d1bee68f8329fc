"""Runs chaos cases: one private cluster, then for each case a workload on a topic of its own,
one fault injected (and healed) while it runs, drain, and the checker. Prints one line per case:

    chaos: <fault> ops=... lost=0 unexpected=0 duplicated=0 skipped=0 conflicting=0 unavailable=Ns

`python -m tests.chaos.run [--short] [F1 F6 ...]` (`make chaos` runs every case); exits non-zero
on any violation. The reconciliation job runs at the end over everything and must find nothing.
"""

import argparse
import os
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import requests

from tests.chaos import fifo_case, ha_cases
from tests.chaos.check import Report, check, deliveries, expectations
from tests.chaos.cluster import Cluster
from tests.chaos.ha import HACluster
from tests.chaos.history import History
from tests.chaos.netns import Namespace
from tests.chaos.skew import worker_clock_skewed
from tests.chaos.workload import CheckEndpoint, Workload
from tests.faultproxy import FaultProxy

# Each the production setting of the same name, made fast so a case fits in a minute.
SETTINGS = {
    "TXHUB_TRANSACTION_TIMEOUT": "1",
    "TXHUB_CHECK_INTERVAL": "1",
    "TXHUB_CHECK_MAX": "3",
    "TXHUB_CHECK_HTTP_TIMEOUT": "5",
    # The black-hole case's producer lives in a network namespace at 10.213.x.2 (this test's
    # own): allowed here only.
    "TXHUB_CALLBACK_ALLOWED_HOSTS": "127.0.0.0/8,::1/128,10.213.0.0/16",
    "TXHUB_ALLOW_HTTP_CALLBACKS": "1",
    "TXHUB_SCAN_SECONDS": "0.5",
    "TXHUB_EXPIRE_SCAN_SECONDS": "1",
    "TXHUB_LOG_LEVEL": "WARNING",
    # The fault cases arm failpoints (refused at start without this outside a debug run).
    "TXHUB_ALLOW_FAILPOINTS": "1",
}


@dataclass
class Context:
    """What a fault may need besides the cluster; `violations` fails the case."""

    cluster: Cluster
    scale: float  # < 1 shortens the fault (make test)
    workload: Workload
    endpoint: CheckEndpoint  # the producer's check endpoint, on the loopback
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what happened, printed with -v
    # Checks run after the drain: a fault's slow consequence (a node rejoining) is awaited while
    # the workload drains, not before.
    afterwards: list[Callable[[], None]] = field(default_factory=list)

    def set_check_url(self, url: str) -> None:
        response = requests.patch(
            f"{self.workload.api}/producer-groups/{self.workload.producer}",
            json={"check_url": url},
            headers=self.workload.headers,
            timeout=10,
        )
        assert response.status_code == 200, response.text


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    inject: Callable[[Context], None]  # injects the fault and heals it
    ha: bool = False  # runs on an HACluster (Patroni, Sentinels: tests/chaos/ha.py)
    unavailable_limit: float | None = None  # the longest stretch with no write allowed
    groups: int = 0  # message groups of a FIFO workload (its consumer group FIFO), 0: none
    consumers: int = 2


def no_fault(ctx: Context) -> None:
    time.sleep(10 * ctx.scale)


def kill_celery(ctx: Context) -> None:
    ctx.cluster.celery_kill()
    time.sleep(20 * ctx.scale)
    ctx.cluster.celery_start()


def crash_postgres(ctx: Context) -> None:
    ctx.cluster.pg_stop("immediate")
    time.sleep(5 * ctx.scale)
    ctx.cluster.pg_start()


def redis_lost(ctx: Context) -> None:
    ctx.cluster.redis_kill_and_wipe()
    time.sleep(3 * ctx.scale)
    ctx.cluster.redis_start()


def redis_paused(ctx: Context) -> None:
    paused_ms = int(15000 * ctx.scale)
    assert ctx.cluster.redis_cli("CLIENT", "PAUSE", str(paused_ms), "ALL") == "OK"
    time.sleep(paused_ms / 1000 + 1)


def _started_at(pid: int) -> int | None:
    """The process's start time (clock ticks since boot): a pid's identity, as pids are reused."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (FileNotFoundError, ProcessLookupError):
        return None


def web_worker_stopped(ctx: Context) -> None:
    """A worker frozen (SIGSTOP) for 20 s. gunicorn's arbiter may replace it meanwhile: a
    uvicorn worker touches its heartbeat once per --timeout, so a long pause outlives it and the
    arbiter kills the worker. Either way the history must show nothing lost; the case records
    which happened instead of assuming the worker is still there to resume."""
    before = ctx.cluster.web_worker_pids()
    victim = before[0]
    born = _started_at(victim)
    os.kill(victim, signal.SIGSTOP)
    try:
        time.sleep(20 * ctx.scale)
    finally:
        resumed = False
        if _started_at(victim) == born:
            try:
                os.kill(victim, signal.SIGCONT)
                resumed = True
            except ProcessLookupError:  # reaped between the look and the signal
                pass
    time.sleep(2)  # a pending SIGABRT of the arbiter's acts once the worker runs again
    alive = _started_at(victim) == born
    deadline = time.monotonic() + 15  # the arbiter forks a replacement for a worker it reaped
    while (
        len(after := ctx.cluster.web_worker_pids()) != len(before) and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    fate = (
        "resumed and still serving"
        if resumed and alive
        else "resumed, then ended by the arbiter's pending signal"
        if resumed
        else "replaced by gunicorn's arbiter while stopped"
    )
    ctx.notes.append(f"stopped worker {victim}: {fate}; workers {before} -> {after}")
    if len(after) != len(before):
        ctx.violations.append(
            f"gunicorn has {len(after)} workers after the case, not {len(before)}"
        )


def callback_black_holed(ctx: Context) -> None:
    """The producer's endpoint in a namespace whose link goes down (SYNs vanish), then a
    listener that accepts and never answers; every check must end at TXHUB_CHECK_HTTP_TIMEOUT."""
    since = ctx.cluster.sql("SELECT now()")[0][0]
    namespace = Namespace()
    silent = socket.create_server(("127.0.0.1", 0), backlog=256)
    try:
        namespace.up()
        ctx.set_check_url(namespace.check_endpoint())
        time.sleep(3 * ctx.scale)
        namespace.black_hole()
        time.sleep(12 * ctx.scale)
        ctx.set_check_url(f"http://127.0.0.1:{silent.getsockname()[1]}/check")
        time.sleep(10 * ctx.scale)
    finally:
        ctx.set_check_url(ctx.endpoint.url)
        silent.close()
        namespace.delete()
    limit_ms = float(SETTINGS["TXHUB_CHECK_HTTP_TIMEOUT"]) * 1000 + 1500
    [(failed, slowest)] = ctx.cluster.sql(
        "SELECT count(*), max((detail->>'latency_ms')::int) FROM broker_oprecord "
        "WHERE op = 'CHECK' AND at >= %s AND detail->>'error' <> ''",
        [since],
    )
    if not failed:
        ctx.violations.append("no check met the black hole: the fault did not bite")
    if (slowest or 0) > limit_ms:
        ctx.violations.append(f"a check took {slowest} ms, over the timeout ({limit_ms:.0f} ms)")


def callback_slow_and_lossy(ctx: Context) -> None:
    """3 s +- 0.5 s before each check reaches the producer; 10% of connections reset."""
    host, port = ctx.endpoint.url.split("//")[1].split("/")[0].split(":")
    proxy = FaultProxy((host, int(port)), seed=11)
    proxy.delay, proxy.jitter, proxy.reset_share = 3.0, 0.5, 0.1
    try:
        ctx.set_check_url(proxy.url + "/check")
        time.sleep(25 * ctx.scale)
    finally:
        ctx.set_check_url(ctx.endpoint.url)
        proxy.close()
    if not proxy.connections:
        ctx.violations.append("no check went through the proxy: the fault did not bite")


def web_failpoint(spec: str) -> Callable[[Context], None]:
    """gunicorn restarted with TXHUB_FAILPOINTS armed: its workers die inside the window."""

    def inject(ctx: Context) -> None:
        ctx.cluster.web_restart(TXHUB_FAILPOINTS=spec)
        try:
            time.sleep(15 * ctx.scale)
        finally:
            ctx.cluster.web_restart()

    return inject


def celery_failpoint(spec: str, queue: str) -> Callable[[Context], None]:
    """The Celery worker of `queue` (the one whose tasks pass the failpoint) restarted with
    TXHUB_FAILPOINTS armed: its pool children die inside the window. The other worker and beat
    keep running, as they would in production while one worker is replaced."""

    def inject(ctx: Context) -> None:
        ctx.cluster.celery_restart(queue, TXHUB_FAILPOINTS=spec)
        try:
            time.sleep(20 * ctx.scale)
        finally:
            ctx.cluster.celery_restart(queue)

    return inject


CASES = {
    case.name: case
    for case in [
        Case("F1", "none (baseline)", no_fault),
        Case(
            "F2",
            "gunicorn workers killed after the half message (or send) is stored, before the answer",
            web_failpoint("after_half_insert=10%exit;after_send_before_answer=10%exit"),
        ),
        Case(
            "F3",
            "gunicorn workers killed after a commit, before its answer (10% of commits)",
            web_failpoint("after_commit_before_answer=10%exit"),
        ),
        Case(
            "F4",
            "gunicorn workers killed after an ack, before its answer (10% of acks)",
            web_failpoint("after_ack_before_answer=10%exit"),
        ),
        Case(
            "F5",
            "Celery pool children killed between the check's answer and its write (30%)",
            # Check-backs run on the "callbacks" queue's worker only (CELERY_TASK_ROUTES).
            celery_failpoint("after_check_answer_before_write=30%exit", "callbacks"),
        ),
        Case("F6", "kill -9 of every Celery worker and beat, restarted after 20 s", kill_celery),
        Case("F7", "Postgres stopped -m immediate under load, restarted", crash_postgres),
        Case("F8", "Redis killed without save and restarted empty", redis_lost),
        Case("F9", "Redis paused 15 s (CLIENT PAUSE)", redis_paused),
        Case(
            "F10",
            "callback black-holed (namespace link down; then a listener that never answers)",
            callback_black_holed,
        ),
        Case("F11", "callback slow (3 s +- 0.5 s) and lossy (10% reset)", callback_slow_and_lossy),
        Case(
            "F12",
            "clock skew: every Celery worker and beat +600 s (libfaketime)",
            lambda ctx: worker_clock_skewed(
                ctx, transaction_timeout=float(SETTINGS["TXHUB_TRANSACTION_TIMEOUT"])
            ),
        ),
        Case("F13", "SIGSTOP of a gunicorn worker for 20 s, then SIGCONT", web_worker_stopped),
        Case(
            "F14",
            "HA: the primary's Patroni and Postgres SIGKILLed under load; it rejoins (pg_rewind)",
            ha_cases.primary_killed,
            ha=True,
            unavailable_limit=30,
        ),
        Case(
            "F15",
            "HA: the primary's Patroni and Postgres SIGSTOPped for 60 s, then resumed",
            ha_cases.primary_hung,
            ha=True,
        ),
        Case("F16", "HA: a planned switchover", ha_cases.switchover, ha=True, unavailable_limit=5),
        Case("F17", "HA: etcd stopped for 30 s", ha_cases.etcd_stopped, ha=True),
        Case("F19", "HA: the Redis master SIGKILLed", ha_cases.redis_master_killed, ha=True),
        Case(
            "F20",
            "FIFO traffic in 50 message groups; gunicorn workers SIGKILLed, consumers killed",
            fifo_case.workers_and_consumers_killed,
            groups=fifo_case.GROUPS,
            consumers=4,
        ),
    ]
}
# The cases `make test` runs, shortened.
SHORT = ["F1", "F2", "F3", "F5", "F8", "F10", "F20"]


def run_case(
    cluster: Cluster, token: str, case: Case, *, scale: float, out: Path, seed: int
) -> Report:
    history = History()
    workload = Workload(
        cluster.base, token, history, name=f"chaos-{case.name}", seed=seed, groups=case.groups
    )
    endpoint = CheckEndpoint()
    try:
        workload.setup(endpoint.url)
        workload.start(producers=4, consumers=case.consumers)
        time.sleep(5 * scale)
        started = time.monotonic()
        context = Context(cluster, scale, workload, endpoint)
        case.inject(context)
        healed = time.monotonic()
        time.sleep(5 * scale)
        workload.stop_producers()
        drain_started = time.monotonic()
        drained = _drain(cluster, workload, history, stall=90)
        drain_took = time.monotonic() - drain_started
        workload.stop_consumers()
        for check_afterwards in context.afterwards:
            check_afterwards()
    finally:
        workload.producing.clear()
        workload.consuming.clear()
        endpoint.close()
        history.dump(out / f"history-{case.name}.jsonl")
    fifo_group = workload.consumer if case.groups else None
    report = check(case.name, workload.topic, history, cluster.sql, fifo_group=fifo_group)
    report.violations = context.violations
    limit = case.unavailable_limit  # a failover takes as long in a shortened case
    if limit is not None and report.unavailable > limit:
        report.violations.append(f"unavailable {report.unavailable:.1f} s, over {limit:.0f} s")
    report.notes.extend(context.notes)
    unknown = Counter(op.f for op in history.ops if op.type == "info" and op.f != "receive")
    replayed = sum(1 for op in history.ops if op.result.get("replayed"))
    report.notes.append(
        f"fault {healed - started:.1f} s; drained: {drained} in {drain_took:.1f} s; "
        f"outcomes unknown: "
        f"{dict(unknown) or 0}; {replayed} retries answered the first answer; "
        f"{endpoint.checks} check-backs answered"
    )
    return report


def _drain(
    cluster: Cluster, workload: Workload, history: History, *, stall: float, limit: float = 900
) -> bool:
    """Until every commit-log row of the case's topic was received, nothing is PREPARED any
    more, and what must arrive has arrived. It gives up once nothing moved for `stall` seconds
    (or after `limit`): a backlog the fault left behind (check-backs of abandoned transactions)
    drains at its own pace, and only a stuck one is reported by the checker."""
    must, _ = expectations(history)
    started = time.monotonic()
    moved_at, last = started, None
    while time.monotonic() - moved_at < stall and time.monotonic() - started < limit:
        received = deliveries(history)
        positions = {(d.queue_id, d.queue_offset) for d in received}
        [(logged, pending)] = cluster.sql(
            "SELECT (SELECT count(*) FROM broker_commitlogentry l WHERE l.topic_id = t.id), "
            "(SELECT count(*) FROM broker_halfmessage h WHERE h.topic_id = t.id "
            "   AND h.state = 'PREPARED') FROM broker_topic t WHERE t.name = %s",
            [workload.topic],
        )
        if not pending and len(positions) == logged and must <= {d.body for d in received}:
            time.sleep(1)  # a last receive round: a duplicate would show now
            return True
        progress = (len(positions), logged, pending)
        if progress != last:
            moved_at, last = time.monotonic(), progress
        time.sleep(0.5)
    return False


def reconcile(cluster: Cluster) -> tuple[bool, str]:
    """The nightly job over today's traffic: it must agree with the checker (no findings)."""
    day = datetime.now(UTC).date().isoformat()
    try:
        printed = cluster.manage("reconcile", "--date", day)
    except Exception as error:  # noqa: BLE001 - reported as a failed check, with its output
        return False, f"reconcile failed: {getattr(error, 'stderr', error)}"
    return " 0 findings" in printed, printed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("cases", nargs="*", help="case names (default: all, or the short set)")
    parser.add_argument("--short", action="store_true", help="shortened faults (make test)")
    parser.add_argument("--no-reconcile", action="store_true")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each case's notes")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED", "9527")))
    args = parser.parse_args(argv)
    names = args.cases or (SHORT if args.short else list(CASES))
    scale = 0.3 if args.short else 1.0
    out = Path(__file__).resolve().parents[2] / "var" / "chaos"
    out.mkdir(parents=True, exist_ok=True)
    failed = False
    # The single-node cases on a Cluster, then the HA cases on an HACluster of their own.
    for kind, chosen in [
        (Cluster, [n for n in names if not CASES[n].ha]),
        (HACluster, [n for n in names if CASES[n].ha]),
    ]:
        if chosen:
            failed = run_on(kind(settings=SETTINGS), chosen, args, scale, out) or failed
    return 1 if failed else 0


def run_on(
    cluster: Cluster, names: list[str], args: argparse.Namespace, scale: float, out: Path
) -> bool:
    failed = False
    try:
        cluster.start()
        token = cluster.manage("create_token", "chaos", "--scope", "admin").split()[0]
        for name in names:
            report = run_case(cluster, token, CASES[name], scale=scale, out=out, seed=args.seed)
            print(report.line(), flush=True)
            failed = failed or not report.ok
            if args.verbose or not report.ok:
                print(report.details(), flush=True)
        if not args.no_reconcile:
            agreed, printed = reconcile(cluster)
            print(f"chaos: reconciliation {'agrees (0 findings)' if agreed else 'DISAGREES'}")
            if not agreed:
                failed = True
                print(printed[-3000:])
    finally:
        cluster.stop()
        name = "cluster-ha.log" if isinstance(cluster, HACluster) else "cluster.log"
        (out / name).write_bytes((cluster.dir / "logs").read_bytes())
        cluster.cleanup()
    return failed


if __name__ == "__main__":
    sys.exit(main())
