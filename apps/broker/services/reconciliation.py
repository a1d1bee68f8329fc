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
from django.db import connection
from django.utils import timezone

from apps.broker.models import ReconciliationRun, RunStatus

ROOT = Path(__file__).resolve().parents[3]
JOB = ROOT / "spark_jobs" / "reconcile.py"


def database_url() -> str:
    """The database Django uses (the test database under tests), as a URL for the job."""
    db = connection.settings_dict
    credentials = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        credentials += ":" + quote(db["PASSWORD"], safe="")
    return (
        f"postgresql://{credentials}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    )


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


def reconciliation_run(*, day: date, master: str) -> ReconciliationRun:
    run = ReconciliationRun.objects.create(day=day, master=master)
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
