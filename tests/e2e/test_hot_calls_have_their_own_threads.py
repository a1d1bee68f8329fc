"""The lean door's hot calls run in threads of their own (TXHUB_WEB_HOT_THREADS, decision 0031):
requests Django answers can hold every one of Django's threads (TXHUB_WEB_THREADS) and a
producer's send is still answered at once.

A real server (one worker, two Django threads), started as `make run` starts it. The test holds
the queue row of topic `slow` locked in its own transaction; two sends to `slow` that Django's door
answers (a query string keeps them from the lean door) block on that lock, each holding one of the
two threads (seen in pg_stat_activity as waiting on a lock). A plain send to topic `fast` (the lean
door) must be answered while they still wait. When all calls shared one pool, it waited behind them
until the lock was let go.
"""

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.db import connection, transaction

from apps.broker.models import CommitLogEntry
from apps.broker.services import registry
from tests.conftest import db_url_for_tests, start_gunicorn
from tests.support.ports import free_port

pytestmark = pytest.mark.e2e

WEB_APP = "txhub-hot-threads-web"


def _web_backends_waiting_on_a_lock() -> int:
    with connection.cursor() as cursor:
        # Asked inside the test's transaction: pg_stat_activity would answer from the snapshot
        # its first read in the transaction took.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event_type = 'Lock'",
            [WEB_APP],
        )
        return int(cursor.fetchone()[0])


def test_a_send_is_answered_while_django_s_threads_are_all_blocked(
    transactional_db: None,
) -> None:
    slow = registry.topic_create(name="slow", queues=1)
    registry.topic_create(name="fast", queues=1)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    _, raw = registry.token_create(name="t", scopes=["admin"])
    headers = {"Authorization": f"Bearer {raw}"}
    port = free_port()
    base = f"http://127.0.0.1:{port}/api/v1"
    web = start_gunicorn(
        port,
        workers=1,
        threads=2,
        extra_env={
            "DATABASE_URL": f"{db_url_for_tests()}?application_name={WEB_APP}",
            "TXHUB_WEB_HOT_THREADS": "2",
        },
    )
    callers = ThreadPoolExecutor(2)
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT 1 FROM broker_messagequeue WHERE topic_id = %s FOR UPDATE", [slow.id]
                )
            blocked = [
                callers.submit(
                    requests.post,
                    f"{base}/topics/slow/messages?through=django",
                    json={"producer_group": "shop", "body": f"slow {n}"},
                    headers=headers,
                    timeout=60,
                )
                for n in range(2)
            ]
            deadline = time.monotonic() + 30
            while _web_backends_waiting_on_a_lock() < 2:
                assert time.monotonic() < deadline, "the two sends to 'slow' never blocked"
                assert not any(f.done() for f in blocked), [f.result().text for f in blocked]
                time.sleep(0.05)

            answer = requests.post(
                f"{base}/topics/fast/messages",
                json={"producer_group": "shop", "body": "fast"},
                headers=headers,
                timeout=10,
            )

            assert answer.status_code == 201, answer.text
            assert not any(f.done() for f in blocked), "the lock was let go too early"
            assert _web_backends_waiting_on_a_lock() == 2
        # The lock is let go: the blocked sends go through.
        assert [f.result().status_code for f in blocked] == [201, 201]
        assert CommitLogEntry.objects.filter(topic__name="slow").count() == 2
        assert CommitLogEntry.objects.filter(topic__name="fast").count() == 1
    finally:
        callers.shutdown(wait=False, cancel_futures=True)
        os.killpg(web.pid, 9)
        web.wait()
