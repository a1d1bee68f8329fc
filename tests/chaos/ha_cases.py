"""The fault cases of a highly available txhub (tests/chaos/ha.py, docs/decisions/0042): what
happens to a machine of the cluster, to its store, to Redis. Each heals its fault and leaves the
cluster whole for the next case; what it saw goes to the case's notes, what it expected and did
not see to its violations. Run on an HACluster only (tests/chaos/run.py picks it)."""

import contextlib
import signal
import time
from typing import TYPE_CHECKING, Any

import requests

from tests.chaos.ha import HACluster, make_groups

if TYPE_CHECKING:
    from tests.chaos.run import Context


def _cluster(ctx: "Context") -> HACluster:
    assert isinstance(ctx.cluster, HACluster), "an HA case runs on an HACluster"
    return ctx.cluster


def _api(ctx: "Context", path: str, payload: dict[str, Any]) -> requests.Response:
    return requests.post(
        ctx.workload.api + path, json=payload, headers=ctx.workload.headers, timeout=10
    )


def _primary(cluster: HACluster) -> int:
    node = cluster.primary()
    assert node is not None, "no primary before the fault"
    return node


def _rejoin(ctx: "Context", cluster: HACluster, node: int, since: float) -> None:
    """The node's Patroni started again (systemd's job on a real machine); nobody else acts.
    Whether it rejoined is checked after the drain (it takes a while)."""
    cluster.start_node(node)

    def rejoined() -> None:
        try:
            state = cluster.wait_rejoined(node, timeout=90)
        except RuntimeError as error:
            ctx.violations.append(f"node{node} did not rejoin: {error}")
            return
        rewound = "pg_rewind" in cluster.logs_of(node).read_text(errors="replace")
        ctx.notes.append(
            f"node{node} streaming again on timeline {state.get('timeline')} "
            f"{time.monotonic() - since:.1f} s after the fault"
            + (" (after pg_rewind)" if rewound else "")
        )

    ctx.afterwards.append(rejoined)


def primary_killed(ctx: "Context") -> None:
    """F14: the primary's machine dies (Patroni and every Postgres process SIGKILLed). The
    synchronous standby is promoted; the old primary, started again, rejoins as a replica."""
    cluster = _cluster(ctx)
    cluster.wait_healthy()
    old = _primary(cluster)
    killed = time.monotonic()
    cluster.signal_node(old, signal.SIGKILL)
    new = cluster.wait_primary(other_than=old, timeout=60)
    ctx.notes.append(f"node{old} killed; node{new} primary {time.monotonic() - killed:.1f} s later")
    time.sleep(10 * ctx.scale)  # the new primary takes writes while the old machine is away
    _rejoin(ctx, cluster, old, killed)


def primary_hung(ctx: "Context") -> None:
    """F15: the primary's machine hangs (SIGSTOP) for 60 s and resumes: the old primary must
    not answer a 2xx once another was promoted (strict synchronous mode: its commits wait for a
    standby that follows someone else), and steps down by itself."""
    cluster = _cluster(ctx)
    cluster.wait_healthy()
    old = _primary(cluster)
    stopped = time.monotonic()
    cluster.signal_node(old, signal.SIGSTOP)
    try:
        new = cluster.wait_primary(other_than=old, timeout=60)
        ctx.notes.append(f"node{old} stopped; node{new} primary {time.monotonic() - stopped:.1f} s")
        time.sleep(max(0.0, 60 * ctx.scale - (time.monotonic() - stopped)))
    finally:
        cluster.signal_node(old, signal.SIGCONT)

    def stepped_down() -> None:
        try:
            state = cluster.wait_rejoined(old, timeout=90)
            ctx.notes.append(f"node{old} resumed and follows (timeline {state.get('timeline')})")
        except RuntimeError as error:
            ctx.violations.append(f"node{old} did not step down and follow: {error}")

    ctx.afterwards.append(stepped_down)


def switchover(ctx: "Context") -> None:
    """F16: a planned switchover to the synchronous standby (what `patronictl switchover` asks
    of Patroni's REST API)."""
    cluster = _cluster(ctx)
    cluster.wait_healthy()
    old = _primary(cluster)
    members = cluster.rest(old, "/cluster").json()["members"]
    candidate = next(m["name"] for m in members if m["role"] == "sync_standby")
    started = time.monotonic()
    answer = cluster.post(old, "/switchover", {"leader": f"node{old}", "candidate": candidate})
    if answer.status_code != 200:
        ctx.violations.append(f"switchover refused: {answer.status_code} {answer.text[:200]}")
        return
    new = cluster.wait_primary(other_than=old, timeout=60)
    ctx.notes.append(f"switchover to node{new} in {time.monotonic() - started:.1f} s")
    time.sleep(10 * ctx.scale)

    def follows() -> None:
        try:
            cluster.wait_rejoined(old, timeout=60)
        except RuntimeError as error:
            ctx.violations.append(f"node{old} did not follow the new primary: {error}")

    ctx.afterwards.append(follows)


def etcd_stopped(ctx: "Context") -> None:
    """F17: the store is gone for 30 s. Patroni decides: a primary that cannot renew its leader
    key steps down after retry_timeout (no failsafe mode), and no acknowledged write is lost."""
    cluster = _cluster(ctx)
    cluster.wait_healthy()
    cluster.stop_etcd()
    try:
        time.sleep(30 * ctx.scale)
        ctx.notes.append(f"primary after {30 * ctx.scale:.0f} s without etcd: {cluster.primary()}")
    finally:
        cluster.ha("start-etcd")

    def whole() -> None:
        try:
            cluster.wait_healthy(timeout=90)
        except RuntimeError as error:
            ctx.violations.append(f"the cluster is not whole after etcd came back: {error}")

    ctx.afterwards.append(whole)


def redis_master_killed(ctx: "Context") -> None:
    """F19: the Redis master SIGKILLed; the Sentinels promote the replica, and check-backs (sent
    through Celery, so through Redis) go on within 30 s. A check whose task a worker had taken
    but not started when its connection died holds its group's in-flight slot only until its
    claim runs out (TXHUB_CHECK_DISPATCH_LEASE, decision 0049). A delayed message due a second
    after the kill is delivered within 30 s too."""
    cluster = _cluster(ctx)
    delayed = f"{ctx.workload.topic}-delayed"  # a topic of its own: the checker's stays as sent
    make_groups(ctx.workload.api, ctx.workload.headers, delayed)
    master = cluster.redis_master()
    killed = time.monotonic()
    cluster.kill_redis(master)
    # Due 1 s after the kill (delay level 1): moved into the commit log only by the delivery
    # scan, which beat triggers through Redis.
    due = {"producer_group": delayed, "body": "due", "delay_level": 1}
    sent = _api(ctx, f"/topics/{delayed}/messages", due)
    assert sent.status_code == 201, sent.text
    promoted = cluster.wait_redis_master(other_than=master, timeout=30)
    ctx.notes.append(
        f"Redis :{master} killed; :{promoted} master {time.monotonic() - killed:.1f} s"
    )
    checks = ctx.endpoint.checks
    limit = 30.0
    while ctx.endpoint.checks == checks and time.monotonic() < killed + limit:
        time.sleep(0.2)
    if ctx.endpoint.checks == checks:
        ctx.violations.append(f"no check-back within {limit:.0f} s of the Redis master's death")
    else:
        ctx.notes.append(f"check-backs again {time.monotonic() - killed:.1f} s after the kill")
    receive = {"topic": delayed, "wait_seconds": 2}
    while time.monotonic() < killed + limit:
        with contextlib.suppress(requests.RequestException):
            if _api(ctx, f"/consumer-groups/{delayed}/receive", receive).json()["messages"]:
                ctx.notes.append(f"delayed delivery {time.monotonic() - killed:.1f} s after it")
                break
    else:
        ctx.violations.append(f"the delayed message not delivered within {limit:.0f} s")
    cluster.ha("start-redis")  # the old master comes back; the Sentinels make it a replica
