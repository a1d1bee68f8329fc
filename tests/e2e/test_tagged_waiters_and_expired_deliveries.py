"""Tag-filtered long polls beside expired deliveries they do not match (docs/decisions/0081), on a
real server started as `make run` starts it (gunicorn + uvicorn workers), whose every Postgres
connection passes a proxy that counts its statements (docs/decisions/0062):

- expired in-flight deliveries are receivable only by a waiter whose tag filter matches them; the
  hub's fallback check (every TXHUB_LONG_POLL_FALLBACK, 1 s) must not wake the others, which would
  each run a receive (a write transaction) every second for as long as the deliveries stay
  expired: N waiters, N receives a second;
- a waiter whose filter matches an expired delivery is still woken by that check (an expiry is
  the passage of time, which no NOTIFY announces).
"""

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from django.conf import settings
from django.db import connection

from apps.broker.models import Delivery, Topic
from apps.broker.services import registry, sending
from tests.conftest import start_gunicorn
from tests.support.listening import database_now, hub_listening
from tests.support.pgwire import StatementCounter
from tests.support.ports import free_port
from tests.support.raw_http import json_request

pytestmark = pytest.mark.e2e

WORKERS = 2
WEB_APP = "txhub-web-tagged"
LISTEN_APP = f"{WEB_APP}-wakeups"
WAITERS = 30
PATH = "/api/v1/consumer-groups/billing/receive"


@pytest.fixture
def web(transactional_db: None) -> Iterator[tuple[int, dict[str, str], StatementCounter]]:
    """A server counted at its proxy; cached configuration kept 120 s (none of it is read again
    during the test, so every statement counted is a receive's or a check's)."""
    registry.topic_create(name="orders", queues=4)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    registry.consumer_group_create(name="billing", max_delivery_attempts=16, consume_from="first")
    _, raw = registry.token_create(name="t", scopes=["admin"])
    db = connection.settings_dict
    counter = StatementCounter((db["HOST"], int(db["PORT"])))
    url = (
        f"postgres://{db['USER']}@127.0.0.1:{counter.port}/{db['NAME']}"
        f"?application_name={WEB_APP}&sslmode=disable&gssencmode=disable"
    )
    port = free_port()
    server = start_gunicorn(
        port,
        workers=WORKERS,
        extra_env={
            "DATABASE_URL": url,
            "TXHUB_DB_POOL_SIZE": "4",
            "TXHUB_CONFIG_CACHE_SECONDS": "120",
        },
    )
    try:
        yield port, {"Authorization": f"Bearer {raw}"}, counter
    finally:
        server.terminate()
        server.wait(timeout=60)
        counter.close()


async def http(port: int, headers: dict[str, str], body: Any) -> tuple[int, Any, float]:
    """One receive on its own connection: (status, JSON answer, when it was answered)."""
    return await json_request(port, "POST", PATH, headers, body)


def waiting_in_background(
    port: int, headers: dict[str, str], bodies: list[dict[str, Any]]
) -> tuple[list[Any], threading.Thread]:
    """The receives `bodies`, all at once, from a thread: their answers once it is joined."""
    answers: list[Any] = []

    async def everyone() -> list[tuple[int, Any, float]]:
        return list(await asyncio.gather(*(http(port, headers, body) for body in bodies)))

    thread = threading.Thread(target=lambda: answers.extend(asyncio.run(everyone())))
    thread.start()
    return answers, thread


def send(tags: str, count: int) -> None:
    topic = Topic.objects.get(name="orders")
    for i in range(count):
        sending.message_send(
            topic=topic,
            message=sending.OutgoingMessage(
                producer_group="shop", body=f"{tags} {i}".encode(), body_is_binary=False, tags=tags
            ),
        )


def expire(tags: str) -> None:
    """The invisible time of the group's deliveries of `tags` runs out now: what the passage of
    time does, announced by nothing."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE broker_delivery d SET invisible_until = now() - interval '1 second' "
            "FROM broker_commitlogentry m WHERE m.offset = d.message_id AND m.tags = %s "
            "AND d.state = 'INFLIGHT'",
            [tags],
        )


@pytest.mark.timeout(120)
def test_waiters_whose_filter_matches_no_expired_delivery_cost_nothing_while_they_wait(
    web: Any,
) -> None:
    port, headers, counter = web
    send("TagA", 20)
    send("TagB", 1)
    # Everything received by a consumer of the group that takes every tag, and left to expire;
    # TagB's invisible time runs out only when the test says so.
    taken = requests.post(
        f"http://127.0.0.1:{port}{PATH}",
        headers=headers,
        json={"topic": "orders", "max_messages": 32, "invisible_seconds": 43200},
        timeout=10,
    )
    assert taken.status_code == 200, taken.text
    assert len(taken.json()["messages"]) == 21
    expire("TagA")
    since = database_now()
    nope = {"topic": "orders", "max_messages": 1, "wait_seconds": 15, "tag_expression": "Nope"}
    matching = {**nope, "tag_expression": "Other || TagB"}
    answers, waiters = waiting_in_background(port, headers, [nope] * WAITERS)
    got, matcher = waiting_in_background(port, headers, [matching])
    try:
        # Each web process has run a fallback check with its waiters registered; their first
        # tries are over.
        hub_listening(LISTEN_APP, since=since)
        time.sleep(2 * settings.TXHUB_LONG_POLL_FALLBACK)
        before, started = counter.snapshot(), time.monotonic()
        time.sleep(4 * settings.TXHUB_LONG_POLL_FALLBACK)
        after, elapsed = counter.snapshot(), time.monotonic() - started
        assert not answers  # all still waiting
        assert not got
        # Positive control: a matching delivery's expiry reaches the waiter that matches it, by
        # the fallback check (no NOTIFY), well before its wait (15 s) ends.
        expired_at = time.monotonic()
        expire("TagB")
        matcher.join()
    finally:
        matcher.join()
        waiters.join()
    assert counter.errors == []
    receives = after["pool"] - before["pool"]
    checks = after["listen"] - before["listen"]
    # 20 expired TagA deliveries nobody waiting can take: before decision 0081 every waiter was
    # woken by every check and ran a receive (five statements or more, a write transaction),
    # hundreds in these four seconds. Now none of them is woken.
    assert receives < WAITERS / 3, f"{receives} statements from idle waiters in {elapsed:.1f} s"
    periods = elapsed / settings.TXHUB_LONG_POLL_FALLBACK + 1
    assert checks <= 2 * WORKERS * periods, f"{checks} statements in {elapsed:.1f} s of checks"
    [(status, answer, answered_at)] = got
    assert status == 200, answer
    assert [(m["tags"], m["delivery_attempt"]) for m in answer["messages"]] == [("TagB", 2)]
    assert answered_at - expired_at < 1 + 3 * settings.TXHUB_LONG_POLL_FALLBACK
    assert answers == [(200, {"messages": []}, answers[i][2]) for i in range(WAITERS)]
    # The TagA deliveries are still there for a consumer that takes them.
    assert Delivery.objects.filter(state="INFLIGHT", message__tags="TagA").count() == 20
