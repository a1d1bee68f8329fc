"""/readyz through a real server: 200 while Postgres and the Celery broker answer, 503 in the
probe's JSON (naming the part that failed) while either does not, and 200 again once it is back.
The faults are on servers of the test's own (`private_cluster`, a dead port), never `make run`'s."""

import os
import signal
from typing import Any

import pytest
import requests

from tests.conftest import start_gunicorn
from tests.support.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.destructive]


def test_readyz_is_503_naming_the_broker_while_it_is_unreachable(
    gunicorn: str, transactional_db: None
) -> None:
    ready = requests.get(f"{gunicorn}/readyz", timeout=10)  # the positive control
    assert (ready.status_code, ready.json()["status"]) == (200, "ok"), ready.text
    port = free_port()
    web = start_gunicorn(
        port, workers=1, extra_env={"CELERY_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0"}
    )
    try:
        answer = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
        assert answer.status_code == 503, answer.text
        body = answer.json()
        assert body["status"] == "unavailable"
        assert body["checks"]["postgres"] == "ok"
        assert body["checks"]["redis"].startswith("error: "), body
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        web.wait(timeout=30)


def test_readyz_is_503_naming_postgres_while_it_is_down_and_200_after(
    private_cluster: Any,
) -> None:
    cluster = private_cluster
    cluster.web_start(TXHUB_DB_POOL_TIMEOUT="2")
    try:
        assert requests.get(cluster.base + "/readyz", timeout=10).status_code == 200
        cluster.pg_stop("immediate")
        try:
            answer = requests.get(cluster.base + "/readyz", timeout=30)
            assert answer.status_code == 503, answer.text
            assert answer.json()["checks"]["postgres"].startswith("error: ")
            assert answer.json()["checks"]["redis"] == "ok"
        finally:
            cluster.pg_start()
        again = requests.get(cluster.base + "/readyz", timeout=30)
        assert again.status_code == 200, again.text
    finally:
        os.killpg(cluster.web.pid, signal.SIGTERM)
        cluster.web.wait(timeout=30)
        cluster.web = None
