"""bench/cpu.py: a part's CPU is a sum that only grows while the servers run (issue 10: the old
accounting printed negative Postgres CPU when backends exited), and client commands are not
servers."""

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import cpu  # noqa: E402

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def _named(argv0: str, code: str, cwd: Path) -> subprocess.Popen[bytes]:
    """A Python process whose command line reads like `argv0` (what cpu.py matches)."""
    return subprocess.Popen(
        ["bash", "-c", f'exec -a "{argv0}" {sys.executable} -c "$0"', code], cwd=cwd
    )


def test_a_worker_child_that_exits_stays_counted(tmp_path: Path) -> None:
    # A prefork "worker" whose child burns 0.4 s of CPU and exits; the worker waits for it.
    code = (
        "import os, time\n"
        "time.sleep(0.5)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        + "".join("    " + line + "\n" for line in BURN.format(s=0.4).splitlines())
        + "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "time.sleep(30)\n"
    )
    worker = _named("celery -A txhub worker -Q celery", code, tmp_path)
    try:
        time.sleep(0.2)
        before = cpu.sample(tmp_path, "/nonexistent")
        deadline = time.monotonic() + 10
        while True:
            after = cpu.sample(tmp_path, "/nonexistent")
            spent = cpu.delta(before, after)["celery"]
            if spent >= 350 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        # The child's 0.4 s, now in the worker's cutime after it exited and was waited for.
        assert spent >= 350, spent
        later = cpu.delta(before, cpu.sample(tmp_path, "/nonexistent"))["celery"]
        assert later >= spent
    finally:
        worker.kill()
        worker.wait()


def _zombie_child_of(parent: int) -> bool:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        if fields[0] == "Z" and fields[1] == str(parent):
            return True
    return False


def test_a_child_that_exited_and_is_not_yet_reaped_stays_counted(tmp_path: Path) -> None:
    # The worker's child burns 0.4 s and exits; the worker reaps it only when the test says so.
    # Meanwhile the child is a zombie: no command line to match, its time not yet in the
    # worker's cutime. Waiting for the zombie, not for a fixed time: on a loaded machine the
    # child may take seconds of wall time to burn its 0.4 s.
    code = (
        "import os, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        + "".join("    " + line + "\n" for line in BURN.format(s=0.4).splitlines())
        + "    os._exit(0)\n"
        "while not os.path.exists('reap'): time.sleep(0.05)\n"
        "os.waitpid(pid, 0)\n"
        "time.sleep(30)\n"
    )
    worker = _named("celery -A txhub worker -Q celery", code, tmp_path)
    try:
        deadline = time.monotonic() + 30
        while not _zombie_child_of(worker.pid):
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.05)
        while_zombie = cpu.sample(tmp_path, "/nonexistent").parts["celery"]
        assert while_zombie >= 350, while_zombie
        (tmp_path / "reap").touch()
        while _zombie_child_of(worker.pid):
            assert time.monotonic() < deadline, "the worker never reaped its child"
            time.sleep(0.05)
        reaped = cpu.sample(tmp_path, "/nonexistent").parts["celery"]
        assert reaped >= while_zombie
    finally:
        worker.kill()
        worker.wait()


def test_a_celery_client_command_is_not_a_server(tmp_path: Path) -> None:
    # run.sh's `celery inspect ping` exits and its parent (run.sh) is not counted: counting it
    # while it lives would make the sum drop when it exits.
    client = _named(
        "celery -A txhub inspect ping", BURN.format(s=0.3) + "time.sleep(30)\n", tmp_path
    )
    try:
        time.sleep(0.6)
        assert cpu.sample(tmp_path, "/nonexistent").parts["celery"] == 0
    finally:
        client.kill()
        client.wait()


def test_a_grpc_server_is_a_part_of_its_own(tmp_path: Path) -> None:
    # `manage.py grpcserver` (run.sh's gRPC door, issue 28): its CPU is the "grpc" part, not the
    # web tier's, so `make bench` can set it beside REST's web CPU.
    server = _named(
        "python manage.py grpcserver",
        "import time\ntime.sleep(0.3)\n" + BURN.format(s=0.3) + "time.sleep(30)\n",
        tmp_path,
    )
    try:
        before = cpu.sample(tmp_path, "/nonexistent")
        deadline = time.monotonic() + 10
        while cpu.delta(before, cpu.sample(tmp_path, "/nonexistent"))["grpc"] < 250:
            assert time.monotonic() < deadline, "the gRPC server's CPU was not counted"
            time.sleep(0.1)
        assert cpu.sample(tmp_path, "/nonexistent").parts["web"] == 0
    finally:
        server.kill()
        server.wait()


def test_the_ceiling_divides_by_the_cpus_whose_busy_time_is_summed() -> None:
    # /proc/stat's first line sums its "cpuN" lines; the machine's online CPUs are those.
    assert cpu.cores() == os.cpu_count()


def test_the_busy_time_leaves_out_steal_and_guest() -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice, in ticks
    line = "cpu  100 10 20 5000 30 1 2 400 50 5"
    assert cpu.busy_ticks(line) == 100 + 10 + 20 + 1 + 2
