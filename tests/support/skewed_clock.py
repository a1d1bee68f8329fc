"""A process of the test's own whose clock runs ahead of the database's, for real: Debian's
libfaketime preloaded into `manage.py shell -c`, as chaos case F12 runs Celery
(tests/chaos/skew.py). Every clock the process reads (time.time, datetime.now, Django's
timezone.now) runs ahead; Postgres' does not. It runs a probe of this module on the test database
and prints what the test asserts on as JSON (docs/decisions/0020, 0102).

libfaketime is found and preloaded by tests/support/faketime.py."""

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.utils import timezone

from apps.broker.services import checkback
from tests.conftest import ROOT, db_url_for_tests
from tests.support.faketime import running_ahead
from tests.support.transactions import result

RESULT = "SKEWED-CLOCK-RESULT "  # the line of the probe's answer on its standard output
CHILD_SECONDS = 60  # a probe still running then has hung: it is killed and the test fails


def run_ahead(seconds: int, probe: str, **args: Any) -> Any:
    """What `probe` (a function of PROBES, called with `args`) returned, run in a process whose
    clock runs `seconds` ahead of this one's and of the database's."""
    child = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            "from tests.support.skewed_clock import main; main()",
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": db_url_for_tests(),
            **running_ahead(seconds),
            "TXHUB_SKEWED_CLOCK_PROBE": json.dumps({"probe": probe, "args": args}),
        },
        capture_output=True,
        text=True,
        timeout=CHILD_SECONDS,
    )
    assert child.returncode == 0, f"the probe failed:\n{child.stdout}\n{child.stderr}"
    lines = child.stdout.splitlines()
    [answer] = [line.removeprefix(RESULT) for line in lines if line.startswith(RESULT)]
    return json.loads(answer)


def checkback_commit(half_id: int, deliver_at: str) -> dict[str, Any]:
    """Check-back's COMMIT of the half (checkback_apply, as a worker applies a producer's answer),
    once this process has seen that by its own clock the half's `deliver_at` is past: the fault
    bites here, or the probe fails."""
    own_now = timezone.now()
    assert own_now > datetime.fromisoformat(deliver_at), (
        f"this process's clock ({own_now.isoformat()}) is not past deliver_at ({deliver_at}): "
        "libfaketime did not take"
    )
    applied = checkback.checkback_apply(half_id=half_id, result=result("COMMIT"))
    return {"own_now": own_now.isoformat(), "applied": applied}


PROBES: dict[str, Callable[..., Any]] = {"checkback_commit": checkback_commit}


def main() -> None:
    asked = json.loads(os.environ["TXHUB_SKEWED_CLOCK_PROBE"])
    answer = PROBES[asked["probe"]](**asked["args"])
    print(RESULT + json.dumps(answer), flush=True)
