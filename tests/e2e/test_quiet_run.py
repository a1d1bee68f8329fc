"""`make run` is quiet while idle (issue 10, part 4): the scans and beat tick every second, and
nothing of it reaches the log."""

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

from celery import Celery as CeleryApp

from tests.conftest import BIN, ROOT, db_url_for_tests
from tests.e2e.conftest import FAST, TEST_BROKER_URL

IDLE_SECONDS = 5


def scans_run(app: CeleryApp, name: str) -> int:
    """How many tasks the scans worker has run so far (Celery's own counters)."""
    stats = app.control.inspect(destination=[name], timeout=2).stats() or {}
    return sum(stats.get(name, {}).get("total", {}).values())


def test_idle_run_prints_no_info_lines_from_scans_or_beat(
    transactional_db: None, tmp_path: Path
) -> None:
    env = {**os.environ, "DATABASE_URL": db_url_for_tests(), "CELERY_BROKER_URL": TEST_BROKER_URL}
    env.update(FAST)
    for knob in ("TXHUB_TASK_LOG_LEVEL", "TXHUB_BEAT_LOG_LEVEL", "TXHUB_LOG_LEVEL"):
        env.pop(knob, None)  # run.sh's defaults
    log_path = tmp_path / "run.log"
    name = f"quiet-scans@{socket.gethostname()}"
    celery = [str(BIN / "celery"), "-A", "txhub"]
    # The command lines of scripts/run.sh (names and queues of this test's own).
    commands = [
        [*celery, "worker", "--loglevel", "INFO", "--concurrency", "2", "-Q", "celery", "-n", name],
        [*celery, "beat", "--loglevel", "WARNING", "--schedule", str(tmp_path / "beat-schedule")],
    ]
    with log_path.open("ab") as log:
        processes = [
            subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for command in commands
        ]
    app = CeleryApp(broker=TEST_BROKER_URL)
    try:
        deadline = time.monotonic() + 60
        while f"{name} ready." not in log_path.read_text(errors="replace"):
            assert all(p.poll() is None for p in processes), log_path.read_text()
            assert time.monotonic() < deadline, "the worker never said it was ready"
            time.sleep(0.1)
        before = scans_run(app, name)
        start = log_path.stat().st_size
        time.sleep(IDLE_SECONDS)
        after = scans_run(app, name)
        idle_log = log_path.read_bytes()[start:].decode(errors="replace")
    finally:
        app.close()
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            process.wait(timeout=30)

    # Beat and the scans did run while we listened (scan period 0.5 s here) ...
    assert after - before >= IDLE_SECONDS, (before, after)
    # ... and said nothing about it at INFO (or anything else: an idle txhub prints nothing).
    chatter = [line for line in idle_log.splitlines() if re.search(r"INFO|WARNING", line)]
    assert chatter == [], chatter
