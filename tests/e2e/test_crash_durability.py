"""CONTRACT invariant 4: a 2xx to a send or a commit means durable. Kill the web server with
SIGKILL and crash Postgres (immediate stop, WAL replay on start): every acknowledged message is
still there and is delivered. On a Postgres of the test's own (`private_cluster`)."""

import os
import signal
from typing import Any

import pytest
import requests

pytestmark = [pytest.mark.e2e, pytest.mark.destructive]


def test_acknowledged_messages_survive_a_web_and_database_crash(private_cluster: Any) -> None:
    cluster = private_cluster
    token = cluster.manage("create_token", "crash", "--scope", "admin").strip()
    headers = {"Authorization": f"Bearer {token}"}
    base = f"{cluster.base}/api/v1"
    cluster.web_start(TXHUB_WEB_THREADS="4")
    setup = [
        ("/topics", {"name": "crash-orders", "queues": 2}),
        ("/producer-groups", {"name": "crash-shop", "check_url": "https://127.0.0.1:9/"}),
        (
            "/consumer-groups",
            {"name": "crash-billing", "max_delivery_attempts": 16, "consume_from": "first"},
        ),
    ]
    for path, body in setup:
        created = requests.post(base + path, headers=headers, json=body, timeout=10)
        assert created.status_code == 201, created.text
    acknowledged = []
    for i in range(20):
        sent = requests.post(
            f"{base}/topics/crash-orders/messages",
            headers=headers,
            timeout=10,
            json={"producer_group": "crash-shop", "body": f"sent {i}"},
        )
        assert sent.status_code == 201
        acknowledged.append(sent.json()["msg_id"])
        prepared = requests.post(
            f"{base}/transactions",
            headers=headers,
            timeout=10,
            json={"producer_group": "crash-shop", "topic": "crash-orders", "body": f"tx {i}"},
        )
        assert prepared.status_code == 201, prepared.text
        tx = prepared.json()
        committed = requests.post(
            f"{base}/transactions/{tx['transaction_id']}/commit", headers=headers, timeout=10
        )
        assert committed.status_code == 200
        acknowledged.append(tx["msg_id"])

    os.killpg(cluster.web.pid, signal.SIGKILL)
    cluster.web.wait()
    cluster.pg_stop("immediate")  # a crash: no shutdown checkpoint, WAL replay on start
    cluster.pg_start()

    stored = cluster.sql(
        "SELECT msg_id FROM broker_commitlogentry JOIN broker_topic t ON t.id = topic_id "
        "WHERE t.name = 'crash-orders'"
    )
    assert {row[0] for row in stored} == set(acknowledged)
    cluster.web_start(TXHUB_WEB_THREADS="4")
    try:
        received = set()
        for _ in range(5):
            answer = requests.post(
                f"{base}/consumer-groups/crash-billing/receive",
                headers=headers,
                timeout=10,
                json={"topic": "crash-orders", "max_messages": 32},
            )
            assert answer.status_code == 200, answer.text
            received |= {m["msg_id"] for m in answer.json()["messages"]}
        assert received == set(acknowledged)
    finally:
        os.killpg(cluster.web.pid, signal.SIGTERM)
        cluster.web.wait(timeout=30)
        cluster.web = None
