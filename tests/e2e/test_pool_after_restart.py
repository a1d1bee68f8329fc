"""After Postgres restarts, a web process whose pool holds many dead idle connections serves the
next request at once (txhub/postgres/base.py). Before, psycopg_pool tested one dead connection
per backoff step (1, 2, 4 ... s) and the request answered 503 at the pool's checkout timeout,
although Postgres was back (CI: 20 s of 503s from one worker after the crash-durability test)."""

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.conf import settings
from django.db import connection

from apps.broker.services import registry
from tests.conftest import ROOT, free_port, start_gunicorn

pytestmark = pytest.mark.e2e


def _server_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def test_a_pool_full_of_dead_connections_serves_at_once_after_a_restart(
    transactional_db: None,
) -> None:
    _, raw = registry.token_create(name="t", scopes=["admin"])
    headers = {"Authorization": f"Bearer {raw}"}
    port = free_port()
    base = f"http://127.0.0.1:{port}/api/v1"
    # One worker, so every request meets the same pool; a checkout timeout (5 s) shorter than
    # 1 + 2 + 4 s, the backoff of testing four dead connections one by one.
    web = start_gunicorn(port, workers=1, threads=16, extra_env={"TXHUB_DB_POOL_TIMEOUT": "5"})
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
        held = _server_connections()
        assert held >= 5, f"the pool holds {held} connections: too few to show anything"
        subprocess.run(
            [str(ROOT / "scripts" / "services.sh"), "restart-postgres", "--immediate"],
            check=True,
            env={**os.environ, "TXHUB_PG_PORT": str(settings.DATABASES["default"]["PORT"])},
        )
        connection.close()  # this test's own connection died with the server
        answers = [requests.get(f"{base}/topics", headers=headers, timeout=30) for _ in range(5)]
        assert [a.status_code for a in answers] == [200] * 5, answers[0].text
    finally:
        os.killpg(web.pid, 9)
        web.wait()
