"""How a long poll ends besides an answer, through a real server as `make run` starts it: a
consumer that leaves while waiting takes nothing with it (a message stored afterwards goes to
the next receive, first attempt), and a server told to stop answers its waiting consumers at
once (an empty answer) instead of holding its stop for their wait_seconds."""

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from django.db import connection

from apps.broker.models import Delivery
from apps.broker.services import registry
from tests.conftest import db_url_for_tests, start_gunicorn
from tests.support.ports import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

WEB_APP = "txhub-web-long-poll-ends"


@pytest.fixture
def web(transactional_db: None) -> Iterator[tuple[int, dict[str, str], Any]]:
    registry.topic_create(name="idle", queues=1)
    registry.producer_group_create(name="shop", check_url="https://127.0.0.1:9/")
    registry.consumer_group_create(name="billing", max_delivery_attempts=16, consume_from="first")
    _, raw = registry.token_create(name="t", scopes=["admin"])
    port = free_port()
    process = start_gunicorn(
        port,
        workers=1,
        extra_env={
            "DATABASE_URL": f"{db_url_for_tests()}?application_name={WEB_APP}",
            "TXHUB_LONG_POLL_FALLBACK": "1",
        },
    )
    try:
        yield port, {"Authorization": f"Bearer {raw}"}, process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def hub_checks() -> tuple[int, Any]:
    """The server's LISTEN connection (pid, when its last query started): while a receive waits,
    its process checks every fallback period (1 s); with no waiter it asks nothing."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, query_start FROM pg_stat_activity WHERE application_name = %s "
            "AND datname = current_database()",
            [f"{WEB_APP}-wakeups"],
        )
        rows = cursor.fetchall()
    return rows[0] if rows else (0, None)


async def open_receive(port: int, headers: dict[str, str], wait: int) -> Any:
    body = json.dumps({"topic": "idle", "wait_seconds": wait}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(
        f"POST /api/v1/consumer-groups/billing/receive HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode()
        + body
    )
    await writer.drain()
    return reader, writer


def test_a_consumer_that_leaves_its_long_poll_takes_no_message(web: Any) -> None:
    port, headers, _ = web

    async def leave() -> None:
        _, writer = await open_receive(port, headers, 20)
        # Waiting: its process checks every second (the positive control of "asks nothing").
        first = await asyncio.to_thread(wait_until, lambda: hub_checks()[1], 20, 0.05)
        await asyncio.to_thread(wait_until, lambda: hub_checks()[1] != first, 5, 0.05)
        writer.close()
        await writer.wait_closed()

    asyncio.run(leave())
    # Gone: the process stops checking for it (no waiter left), well before its 20 s are up.
    settled = wait_until(lambda: _unchanged_for(2.5), timeout=10, interval=0)
    assert settled, "the server kept checking for a consumer that had left"
    sent = requests.post(
        f"http://127.0.0.1:{port}/api/v1/topics/idle/messages",
        headers=headers,
        json={"producer_group": "shop", "body": "after the leaver"},
        timeout=10,
    )
    assert sent.status_code == 201, sent.text
    time.sleep(1.5)  # a fallback period: a forgotten waiter would have taken it by now
    assert not Delivery.objects.exists()
    answer = requests.post(
        f"http://127.0.0.1:{port}/api/v1/consumer-groups/billing/receive",
        headers=headers,
        json={"topic": "idle"},
        timeout=10,
    )
    [message] = answer.json()["messages"]
    assert (message["body"], message["delivery_attempt"]) == ("after the leaver", 1)


def _unchanged_for(seconds: float) -> bool:
    before = hub_checks()[1]
    time.sleep(seconds)
    return bool(hub_checks()[1] == before)


def test_a_stopping_server_answers_its_waiting_consumers(web: Any) -> None:
    """SIGTERM, gunicorn's graceful stop (`make run`'s Ctrl-C, a deploy): five consumers wait
    20 s each; each gets its 200 with no messages well before, and the server exits."""
    port, headers, process = web

    async def wait_then_stop() -> list[tuple[int, float]]:
        opened = [await open_receive(port, headers, 20) for _ in range(5)]
        await asyncio.to_thread(wait_until, lambda: hub_checks()[1], 20, 0.05)
        stopped_at = time.monotonic()
        process.send_signal(signal.SIGTERM)  # gunicorn's graceful stop, as `make run`'s Ctrl-C

        async def answer_of(reader: Any) -> tuple[int, float]:
            line = await reader.readline()
            return (int(line.split()[1]) if line else 0), time.monotonic() - stopped_at

        try:
            return list(await asyncio.gather(*(answer_of(r) for r, _ in opened)))
        finally:
            for _, writer in opened:
                writer.close()

    answers = asyncio.run(wait_then_stop())
    assert [status for status, _ in answers] == [200] * 5, answers
    assert max(seconds for _, seconds in answers) < 10, answers  # not held to their 20 s
    process.wait(timeout=30)
