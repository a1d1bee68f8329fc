"""CONTRACT invariant 4: a 2xx to a send or a commit means durable. Kill the web server with
SIGKILL and crash Postgres (immediate stop, WAL replay on start): every acknowledged message is
still there and is delivered."""

import os
import signal
import subprocess

import pytest
import requests
from django.conf import settings
from django.db import connection

from apps.broker.models import CommitLogEntry
from apps.broker.services import registry
from tests.conftest import ROOT, free_port, start_gunicorn

pytestmark = pytest.mark.e2e


def test_acknowledged_messages_survive_a_web_and_database_crash(transactional_db: None) -> None:
    registry.topic_create(name="orders", queues=2)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    registry.consumer_group_create(name="billing", max_delivery_attempts=16, consume_from="first")
    _, raw = registry.token_create(name="t", scopes=["admin"])
    headers = {"Authorization": f"Bearer {raw}"}
    port = free_port()
    base = f"http://127.0.0.1:{port}/api/v1"
    web = start_gunicorn(port, workers=1, threads=4)
    acknowledged = []
    for i in range(20):
        sent = requests.post(
            f"{base}/topics/orders/messages",
            headers=headers,
            timeout=10,
            json={"producer_group": "shop", "body": f"sent {i}"},
        )
        assert sent.status_code == 201
        acknowledged.append(sent.json()["msg_id"])
        prepared = requests.post(
            f"{base}/transactions",
            headers=headers,
            timeout=10,
            json={"producer_group": "shop", "topic": "orders", "body": f"tx {i}"},
        )
        assert prepared.status_code == 201, prepared.text
        tx = prepared.json()
        committed = requests.post(
            f"{base}/transactions/{tx['transaction_id']}/commit", headers=headers, timeout=10
        )
        assert committed.status_code == 200
        acknowledged.append(tx["msg_id"])

    os.killpg(web.pid, signal.SIGKILL)
    web.wait()
    # The Postgres this test's database lives on (TXHUB_PG_PORT is what services.sh restarts).
    pg_port = str(settings.DATABASES["default"]["PORT"])
    subprocess.run(
        [str(ROOT / "scripts" / "services.sh"), "restart-postgres", "--immediate"],
        check=True,
        env={**os.environ, "TXHUB_PG_PORT": pg_port},
    )
    connection.close()  # this test's own connection died with the server; the pool hands a new one

    assert set(CommitLogEntry.objects.values_list("msg_id", flat=True)) == set(acknowledged)
    web = start_gunicorn(port, workers=1, threads=4)
    try:
        received = set()
        for _ in range(5):
            answer = requests.post(
                f"{base}/consumer-groups/billing/receive",
                headers=headers,
                timeout=10,
                json={"topic": "orders", "max_messages": 32},
            )
            assert answer.status_code == 200, answer.text
            batch = answer.json()["messages"]
            received |= {m["msg_id"] for m in batch}
        assert received == set(acknowledged)
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        web.wait(timeout=30)
