import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, ROOT, db_url_for_tests

TEST_BROKER_URL = f"redis://127.0.0.1:{os.environ.get('TXHUB_REDIS_PORT', '63799')}/1"


@pytest.fixture
def celery_processes(transactional_db: None, tmp_path: Path) -> Iterator[None]:
    """A real Celery worker and beat on the test database and their own Redis database."""
    env = {
        **os.environ,
        "DATABASE_URL": db_url_for_tests(),
        "CELERY_BROKER_URL": TEST_BROKER_URL,
        "TXHUB_EXPIRE_SCAN_SECONDS": "1",
    }
    logs = tmp_path / "celery.log"
    with logs.open("w") as log:
        worker = subprocess.Popen(
            [
                str(BIN / "celery"),
                "-A",
                "txhub",
                "worker",
                "--concurrency",
                "2",
                "--loglevel",
                "INFO",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        beat = subprocess.Popen(
            [
                str(BIN / "celery"),
                "-A",
                "txhub",
                "beat",
                "--loglevel",
                "INFO",
                "--schedule",
                str(tmp_path / "beat-schedule"),
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield
        finally:
            for process in (beat, worker):
                process.terminate()
            for process in (beat, worker):
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
            time.sleep(0.2)
