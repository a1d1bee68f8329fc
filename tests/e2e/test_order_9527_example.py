"""The order-9527 example end to end: the service dies after its local commit and before its
commit call; check-back (through the SDK's receiver and the barrier) delivers the order exactly
once. The same crash with transaction.on_commit + Celery loses the message."""

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from apps.broker.models import CommitLogEntry, HalfMessage
from tests.conftest import ROOT, Server
from tests.support import workers
from tests.support.ports import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def run(args: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=60,
        **kwargs,
    )


def test_a_crash_after_the_local_commit_is_settled_by_check_back(
    server: Server, start_celery: Any, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "TXHUB_URL": server.base,
        "ORDER_SERVICE_STATE": str(tmp_path),
        "CELERY_BROKER_URL": workers.redis_url("spare"),
    }
    admin = server.token("admin")["Authorization"].split()[1]
    setup = run(
        ["examples.order_service.service", "setup", "--admin-token", admin, "--port", str(port)],
        env,
    )
    assert setup.returncode == 0, setup.stderr
    receiver = subprocess.Popen(
        [sys.executable, "-m", "examples.order_service.service", "serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        start_celery()
        crashed = run(
            ["examples.order_service.service", "place", "9527", "--crash-after-local-commit"], env
        )
        assert crashed.returncode == 1, crashed.stdout + crashed.stderr
        assert "crashing after the local commit" in crashed.stdout
        half = HalfMessage.objects.get(keys=["9527"])
        assert half.state == "PREPARED"  # the commit call never happened
        assert wait_until(
            lambda: HalfMessage.objects.get(pk=half.pk).state == "COMMITTED", timeout=30
        )
        assert HalfMessage.objects.get(pk=half.pk).resolved_by == "CHECK_BACK"
        consumed = run(["examples.order_service.consumer", "--once"], env)
        assert consumed.stdout.count("received: order 9527 created") == 1, (
            consumed.stdout + consumed.stderr
        )

        lost = run(
            [
                "examples.order_service.service",
                "place-on-commit",
                "9528",
                "--crash-after-local-commit",
            ],
            env,
        )
        assert lost.returncode == 1, lost.stdout + lost.stderr
        with sqlite3.connect(tmp_path / "orders.db") as db:
            saved = {row[0] for row in db.execute("SELECT id FROM orders")}
        assert saved == {"9527", "9528"}  # both orders are saved locally...
        assert not HalfMessage.objects.filter(
            keys=["9528"]
        ).exists()  # ...but 9528's message is gone
        assert not CommitLogEntry.objects.filter(keys=["9528"]).exists()
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)
