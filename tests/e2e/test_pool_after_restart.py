"""After Postgres restarts, a web process whose pool holds many dead idle connections serves the
next request at once (txhub/postgres/base.py). Before, psycopg_pool tested one dead connection
per backoff step (1, 2, 4 ... s) and the request answered 503 at the pool's checkout timeout,
although Postgres was back (CI: 20 s of 503s from one worker after the crash-durability test).
On a Postgres of the test's own (`private_cluster`)."""

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

pytestmark = [pytest.mark.e2e, pytest.mark.destructive]


def test_a_pool_full_of_dead_connections_serves_at_once_after_a_restart(
    private_cluster: Any,
) -> None:
    cluster = private_cluster
    token = cluster.manage("create_token", "pool", "--scope", "admin").strip()
    headers = {"Authorization": f"Bearer {token}"}
    base = f"{cluster.base}/api/v1"
    # One worker, so every request meets the same pool; a checkout timeout (5 s) shorter than
    # 1 + 2 + 4 s, the backoff of testing four dead connections one by one.
    cluster.web_start(TXHUB_WEB_THREADS="16", TXHUB_DB_POOL_TIMEOUT="5")
    try:
        with ThreadPoolExecutor(16) as pool:
            codes = list(
                pool.map(
                    lambda _: (
                        requests.get(f"{base}/topics", headers=headers, timeout=30).status_code
                    ),
                    range(400),
                )
            )
        assert set(codes) == {200}
        (held,) = cluster.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )[0]
        assert held >= 5, f"the pool holds {held} connections: too few to show anything"
        cluster.pg_stop("immediate")
        cluster.pg_start()
        answers = [requests.get(f"{base}/topics", headers=headers, timeout=30) for _ in range(5)]
        assert [a.status_code for a in answers] == [200] * 5, answers[0].text
    finally:
        os.killpg(cluster.web.pid, 9)
        cluster.web.wait()
        cluster.web = None
