"""The fault cases of a highly available txhub (tests/chaos/ha.py, docs/decisions/0042): what
happens to a machine of the cluster, to its store, to Redis. Each heals its fault and leaves the
cluster whole for the next case; what it saw goes to the case's notes, what it expected and did
not see to its violations. Run on an HACluster only (tests/chaos/run.py picks it)."""

import signal
import time
from typing import TYPE_CHECKING

from tests.chaos.ha import HACluster

if TYPE_CHECKING:
    from tests.chaos.run import Context


def _cluster(ctx: "Context") -> HACluster:
    assert isinstance(ctx.cluster, HACluster), "an HA case runs on an HACluster"
    return ctx.cluster


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
