"""F20 (issue 29 calls it F18; F14-F19 are the HA cases, decision 0057): FIFO traffic (sends and
transactions, committed and rolled back, in many message groups; consumers of a FIFO consumer
group) while gunicorn workers are SIGKILLed and consumers die mid-exchange. The checker adds its
ordering check (tests/chaos/ordering.py) to the usual counts."""

import os
import signal
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.chaos.run import Context

GROUPS = 50  # message groups: several messages each even on a busy machine


def workers_and_consumers_killed(ctx: "Context") -> None:
    """Every 2 s, in turn: kill -9 of a gunicorn worker (its arbiter starts another), and a
    consumer killed at one of its kill points (tests/chaos/workload.py) and replaced."""
    before = ctx.cluster.web_worker_pids()
    killed_workers, killed_consumers = [], []
    deadline = time.monotonic() + 30 * ctx.scale
    turn = 0
    while time.monotonic() < deadline:
        time.sleep(2)
        if turn % 2 == 0:
            workers = ctx.cluster.web_worker_pids()
            if workers:
                victim = workers[turn // 2 % len(workers)]
                os.kill(victim, signal.SIGKILL)
                killed_workers.append(victim)
        else:
            victim_name = ctx.workload.live_consumers()[0]
            ctx.workload.kill_consumer(victim_name)
            killed_consumers.append(victim_name)
        turn += 1
    wait_until = time.monotonic() + 30  # the arbiter forks a replacement for each worker
    while len(ctx.cluster.web_worker_pids()) != len(before) and time.monotonic() < wait_until:
        time.sleep(0.2)
    after = ctx.cluster.web_worker_pids()
    ctx.notes.append(
        f"killed {len(killed_workers)} gunicorn workers and consumers {killed_consumers}; "
        f"workers {before} -> {after}"
    )
    if len(after) != len(before):
        ctx.violations.append(f"gunicorn has {len(after)} workers after the case")
    if not killed_workers or not killed_consumers:
        ctx.violations.append("nothing was killed: the fault did not bite")
    ctx.afterwards.append(lambda: _fifo_traffic_seen(ctx))


def _fifo_traffic_seen(ctx: "Context") -> None:
    """The case proves something only if groups held messages back and heads came back."""
    [(grouped, groups, transactions, redelivered)] = ctx.cluster.sql(
        "SELECT count(*), count(DISTINCT l.message_group), count(l.transaction_id), "
        "  (SELECT count(*) FROM broker_delivery d WHERE d.topic_id = t.id "
        "     AND d.message_group <> '' AND d.attempts > 1) "
        "FROM broker_commitlogentry l JOIN broker_topic t ON t.id = l.topic_id "
        "WHERE t.name = %s AND l.message_group <> '' GROUP BY t.id",
        [ctx.workload.topic],
    ) or [(0, 0, 0, 0)]
    ctx.notes.append(
        f"{grouped} messages in {groups} message groups ({transactions} committed "
        f"transactions); {redelivered} FIFO deliveries redelivered"
    )
    if groups < GROUPS // 2 or not transactions:
        ctx.violations.append(f"too little FIFO traffic: {grouped} messages in {groups} groups")
    if not redelivered:
        ctx.violations.append("no FIFO delivery was redelivered: no head came back")
