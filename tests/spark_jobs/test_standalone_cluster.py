"""The same job, unchanged, on a real standalone Spark cluster (a master and one worker started
here from PySpark's own bin/spark-class on 127.0.0.1), launched the way beat launches it:
`manage.py reconcile` -> spark-submit. It must find what the local run finds."""

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest
from django.core.management import call_command
from pyspark.sql import SparkSession

from apps.broker.models import ReconciliationRun, RunStatus
from tests.conftest import ROOT
from tests.support.ports import free_port
from tests.support.reconciliation import (
    MAX_PENDING_AGE,
    Shop,
    found,
    inject_one_of_each,
    run_job,
)

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
# A master, a worker and spark-submit's own JVM start here: slower than the suite's 300 s bound
# on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def wait_for_port(port: int, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise RuntimeError(f"nothing listens on {port}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: Any) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("spark-cluster")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(logs / "work")}
    port, ui, worker_ui = free_port(), free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    processes = []
    with open(logs / "master.log", "w") as master_log:
        processes.append(
            subprocess.Popen(
                [
                    str(SPARK_CLASS),
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--webui-port",
                    str(ui),
                ],
                env=env,
                stdout=master_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    try:
        wait_for_port(port)
        with open(logs / "worker.log", "w") as worker_log:
            processes.append(
                subprocess.Popen(
                    [
                        str(SPARK_CLASS),
                        "org.apache.spark.deploy.worker.Worker",
                        master_url,
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        "2",
                        "--memory",
                        "1g",
                        "--webui-port",
                        str(worker_ui),
                    ],
                    env=env,
                    stdout=worker_log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        wait_for_worker(logs / "master.log")
        yield master_url
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def wait_for_worker(master_log: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if "Registering worker" in master_log.read_text():
            return
        time.sleep(0.3)
    raise RuntimeError("the worker did not register with the master")


def test_a_standalone_cluster_finds_what_local_mode_finds(
    unconstrained: None, spark: SparkSession, cluster: str, tmp_path: Any, settings: Any
) -> None:
    shop = Shop()
    shop.normal_traffic()
    injected = inject_one_of_each(shop)
    local = run_job(spark, tmp_path)
    settings.TXHUB_RECONCILE_OUTPUT = tmp_path
    settings.TXHUB_MAX_PENDING_AGE = MAX_PENDING_AGE

    call_command("reconcile", "--date", local.day.isoformat(), "--master", cluster)

    on_cluster = ReconciliationRun.objects.exclude(pk=local.pk).get()
    assert on_cluster.master == cluster
    assert on_cluster.status == RunStatus.FINDINGS, on_cluster.error
    assert found(on_cluster) == found(local) == injected
    assert on_cluster.counts["rows"] == local.counts["rows"]
    assert on_cluster.summary == local.summary
    assert (ROOT / "spark_jobs" / "reconcile.py").exists()
