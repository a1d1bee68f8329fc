"""Server CPU of one txhub run, per part (web / Postgres / Celery / gRPC), that cannot go negative.

Each part is the processes whose working directory is this checkout (run.sh `cd`s there; other
checkouts' servers on the same machine are left out) or, for Postgres, the cluster's data
directory. A process's CPU is its own user + system time PLUS the time of its children that have
exited and been waited for (cutime + cstime in /proc/PID/stat). A Postgres backend that exits
during the run moves its time into the postmaster's cutime, a recycled gunicorn or Celery pool
process into its parent's: the sum over the live processes only grows, so a delta is >= 0. (The
old accounting summed live processes only, and went negative when backends exited.)

System-wide /proc/stat minus this process's own CPU is printed beside it as a cross-check; on a
shared machine it also counts the neighbours, so it is an upper bound, not the figure.
"""

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
WEB = re.compile(r"gunicorn|uvicorn|daphne|hypercorn|granian|txhub\.(a|w)sgi")
# Servers only: a `celery inspect ping` (run.sh's start-up check) is a client whose parent, run.sh,
# is not counted, so its time would vanish from the sum when it exits (a negative delta).
CELERY = re.compile(r"celery .*\b(worker|beat)\b")
# The RocketMQ gRPC door's processes (run.sh starts TXHUB_GRPC_PROCESSES of them).
GRPC = re.compile(r"manage\.py grpcserver\b")


@dataclass
class Sample:
    parts: dict[str, float]  # ms of CPU since boot, per part, exited children included
    system_busy_ms: float  # /proc/stat, all CPUs, non-idle
    own_ms: float  # this bench process and its waited-for children (pgbench, Django setup)


def _stat(pid: str) -> tuple[str, str, float]:
    """(state, parent pid, ms of CPU with its waited-for children's) from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # state, ppid, then utime, stime, cutime, cstime (fields 3, 4, 14-17 of proc(5))
    return fields[0], fields[1], sum(int(value) for value in fields[11:15]) * 1000 / TICKS


def process_ms(pid: int) -> float:
    """One process's CPU, ms, with its waited-for children's."""
    return _stat(str(pid))[2]


def _scan(root_text: str, pg_data_dir: str) -> tuple[dict[str, float], frozenset[str]]:
    """ms per part, and which processes were counted ("pid" live, "pid Z" not yet reaped)."""
    parts = {"web": 0.0, "postgres": 0.0, "celery": 0.0, "grpc": 0.0}
    part_of: dict[str, str] = {}
    zombies: dict[str, tuple[str, float]] = {}
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            state, parent, ms = _stat(pid)
            if state == "Z":
                # Exited, not yet waited for: no command line to match, and its time is not in
                # its parent's cutime until the parent reaps it.
                zombies[pid] = (parent, ms)
                continue
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(f"/proc/{pid}/cwd")
            if cmdline.startswith("postgres") and cwd == pg_data_dir:
                part = "postgres"
            elif not cwd.startswith(root_text):
                continue
            elif WEB.search(cmdline):
                part = "web"
            elif CELERY.search(cmdline):
                part = "celery"
            elif GRPC.search(cmdline):
                part = "grpc"
            else:
                continue
            # Only the top of each tree is counted with its children's exited time; a live
            # child is counted itself, so nothing is counted twice.
            parts[part] += ms
            part_of[pid] = part
        except (OSError, IndexError, ValueError):
            continue  # exited while we looked: its time is now in its parent's cutime
    counted = set(part_of)
    for pid, (parent, ms) in zombies.items():
        # Counted with its parent's part, as it will be once reaped (in the parent's cutime).
        if parent in part_of:
            parts[part_of[parent]] += ms
            counted.add(f"{pid} Z")
    return parts, frozenset(counted)


def sample(root: Path, pg_data_dir: str) -> Sample:
    root_text = str(root.resolve())
    # A child reaped (or exiting) while /proc is read can be missed, or counted twice, in that
    # one read: two reads that counted the same processes in the same states saw none of that.
    parts, counted = _scan(root_text, pg_data_dir)
    for _ in range(5):
        again, counted_again = _scan(root_text, pg_data_dir)
        if counted_again == counted:
            parts = again
            break
        parts, counted = again, counted_again
    busy = busy_ticks(Path("/proc/stat").read_text().splitlines()[0])
    return Sample(parts, busy * 1000 / TICKS, own_ms())


def busy_ticks(stat_line: str) -> int:
    """The busy ticks of a /proc/stat "cpu" line: user, nice, system, irq and softirq. Not idle,
    iowait or steal (time the host gave others), nor guest and guest_nice (already counted in
    user and nice)."""
    values = [int(v) for v in stat_line.split()[1:]]
    return values[0] + values[1] + values[2] + values[5] + values[6]


def own_ms() -> float:
    """This process's CPU and its waited-for children's, ms."""
    times = os.times()
    return (times.user + times.system + times.children_user + times.children_system) * 1000


def cores() -> int:
    """The CPUs /proc/stat counts (its "cpuN" lines): the ones its busy time is the sum of."""
    lines = Path("/proc/stat").read_text().splitlines()
    return sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())


def delta(before: Sample, after: Sample) -> dict[str, float]:
    """ms of CPU per part between two samples, plus "system" (all CPUs minus this bench)."""
    out = {part: after.parts[part] - before.parts[part] for part in before.parts}
    out["system"] = (after.system_busy_ms - before.system_busy_ms) - (after.own_ms - before.own_ms)
    return out


def per_call(
    root: Path, pg_data_dir: str, *, calls: int, call: Callable[[], object], server: str
) -> tuple[float, float]:
    """(the `server` part's ms, Postgres ms) per call, over `calls` calls of `call` in a row."""
    before = sample(root, pg_data_dir)
    for _ in range(calls):
        call()
    spent = delta(before, sample(root, pg_data_dir))
    return spent[server] / calls, spent["postgres"] / calls
