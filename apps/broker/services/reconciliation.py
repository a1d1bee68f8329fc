"""Runs the nightly reconciliation (spark_jobs/reconcile.py) under spark-submit and records it.

The run row is created here, before Spark starts, so a job that never starts or dies half way
still leaves a FAILED run with the reason; the job itself stores its findings and outcome.
"""

import os
import subprocess
import sys
from datetime import date
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.broker.models import ReconciliationRun, RunStatus

ROOT = Path(__file__).resolve().parents[3]
JOB = ROOT / "spark_jobs" / "reconcile.py"


def database_url() -> str:
    """The database Django uses (the test database under tests), as a URL for the job; with
    several hosts (docs/decisions/0042) in libpq's multi-host form, asking for the primary (the
    job reads a standby through JDBC by itself)."""
    db = connection.settings_dict
    credentials = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        credentials += ":" + quote(db["PASSWORD"], safe="")
    hosts = str(db["HOST"] or "127.0.0.1").split(",")
    ports = str(db["PORT"] or 5432).split(",")
    addresses = ",".join(f"{host}:{port}" for host, port in zip(hosts, ports, strict=True))
    options = db.get("OPTIONS") or {}
    query = "?target_session_attrs=read-write" if options.get("target_session_attrs") else ""
    return f"postgresql://{credentials}@{addresses}/{db['NAME']}{query}"


def spark_submit_command(*, day: date, master: str, run_id: int) -> list[str]:
    return [
        settings.TXHUB_SPARK_SUBMIT,
        "--master",
        master,
        "--jars",
        settings.TXHUB_JDBC_JAR,
        # The driver's JVM is started by spark-submit, so its memory is set here, not in the job.
        "--driver-memory",
        settings.TXHUB_SPARK_DRIVER_MEMORY,
        "--conf",
        "spark.driver.host=127.0.0.1",
        "--conf",
        "spark.ui.showConsoleProgress=false",
        str(JOB),
        "--date",
        day.isoformat(),
        "--master",
        master,
        "--run-id",
        str(run_id),
        "--max-pending-age",
        str(settings.TXHUB_MAX_PENDING_AGE),
        "--output",
        str(settings.TXHUB_RECONCILE_OUTPUT),
    ]


# The key of the advisory lock under which a nightly run claims its day (any fixed number).
NIGHTLY_CLAIM_LOCK = 0x7478_6E69  # "txni"


def reconciliation_run_nightly(*, day: date, master: str) -> ReconciliationRun | None:
    """The nightly run of `day`, once however many beats trigger it (one per machine, decision
    0044); None when another run of that day is under way or has succeeded. A failed day runs
    again when triggered again."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            # Lock (advisory, to the end of this transaction): two beats' tasks that start
            # together must not both find no run of the day and both start one.
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [NIGHTLY_CLAIM_LOCK])
        if ReconciliationRun.objects.filter(day=day).exclude(status=RunStatus.FAILED).exists():
            return None
        run = ReconciliationRun.objects.create(day=day, master=master)
    return _execute(run)


def reconciliation_run(*, day: date, master: str) -> ReconciliationRun:
    """A run of `day` now (manage.py reconcile, an operator's rerun), whatever ran before."""
    return _execute(ReconciliationRun.objects.create(day=day, master=master))


def _execute(run: ReconciliationRun) -> ReconciliationRun:
    day, master = run.day, run.master
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        # Driver and (if any) Python workers use this venv's Python.
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    command = spark_submit_command(day=day, master=master, run_id=run.pk)
    try:
        done = subprocess.run(  # noqa: S603 - our own command line, no shell
            command,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=settings.TXHUB_RECONCILE_TIMEOUT,
            check=False,
        )
        failure = f"spark-submit exited with {done.returncode}:\n{done.stderr[-6000:]}"
        failed = done.returncode != 0
    except (OSError, subprocess.TimeoutExpired) as error:
        failure, failed = f"spark-submit did not finish: {error}", True
    run.refresh_from_db()
    if failed or run.status == RunStatus.RUNNING:
        # The job marks its own failures; this catches the ones it could not (no JVM, killed).
        ReconciliationRun.objects.filter(pk=run.pk).exclude(status=RunStatus.FAILED).update(
            status=RunStatus.FAILED,
            finished_at=timezone.now(),
            error=failure if failed else "the job ended without reporting a result",
        )
        run.refresh_from_db()
    return run
