"""While no primary is reachable (a failover under way, etcd gone: every node read-only), API
calls answer 503 `unavailable` in the contract's format within TXHUB_DB_POOL_TIMEOUT, never hang
and never 2xx; once a primary is back they succeed again (CONTRACT 7, docs/decisions/0042).

"No primary" on the test's own Postgres (`private_cluster`): it turns read-only and drops its
sessions, as a demoted primary does, and txhub connects with `target_session_attrs=read-write`,
as in `make run-ha`, so libpq refuses it as it refuses a standby."""

import os
import time
from typing import Any

import pytest
import requests

pytestmark = [pytest.mark.e2e, pytest.mark.perf]

POOL_TIMEOUT = 1.5


def _read_only(cluster: Any, on: bool) -> None:
    value = "on" if on else "off"
    cluster.sql(f"ALTER SYSTEM SET default_transaction_read_only = {value}")
    cluster.sql("SELECT pg_reload_conf()")
    cluster.sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )


def test_without_a_primary_calls_answer_503_within_the_pool_timeout(
    private_cluster: Any,
) -> None:
    cluster = private_cluster
    token = cluster.manage("create_token", "no-primary", "--scope", "admin").split()[0]
    headers = {"Authorization": f"Bearer {token}"}
    base = f"{cluster.base}/api/v1"
    cluster.web_start(
        DATABASE_URL=cluster.database_url + "?target_session_attrs=read-write&connect_timeout=2",
        TXHUB_DB_POOL_TIMEOUT=str(POOL_TIMEOUT),
    )
    try:
        created = requests.post(
            f"{base}/topics", json={"name": "no-primary"}, headers=headers, timeout=30
        )
        assert created.status_code == 201, created.text
        _read_only(cluster, True)
        time.sleep(0.5)  # the reload reaches every backend
        for method, path, body in [
            ("GET", "/topics", None),
            ("POST", "/topics/no-primary/messages", {"producer_group": "x", "body": "b"}),
            ("POST", "/transactions", {"producer_group": "x", "topic": "no-primary", "body": "b"}),
        ]:
            started = time.monotonic()
            answer = requests.request(
                method, base + path, json=body, headers=headers, timeout=POOL_TIMEOUT + 20
            )
            took = time.monotonic() - started
            assert answer.status_code == 503, (path, answer.status_code, answer.text[:200])
            assert answer.json()["error"]["code"] == "unavailable"
            assert took < POOL_TIMEOUT + 2, f"{path} took {took:.1f} s"
        _read_only(cluster, False)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if requests.get(f"{base}/topics", headers=headers, timeout=30).status_code == 200:
                break
            time.sleep(0.2)
        else:
            pytest.fail("no 200 within 20 s of a primary being back")
    finally:
        _read_only(cluster, False)
        os.killpg(cluster.web.pid, 9)
        cluster.web.wait()
        cluster.web = None
