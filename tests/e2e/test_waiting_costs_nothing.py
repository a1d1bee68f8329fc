"""Issue 10 item 1, "Waiting costs nothing" (docs/decisions/0024), on a real server started as
`make run` starts it (gunicorn + uvicorn workers):

- 500 long polls at once hold no thread and no database connection: a producer's sends keep their
  latency, every waiter is answered by wait_seconds + 1 s, and Postgres connections stay within the
  pool (x web processes, + one LISTEN connection each);
- a waiting consumer is woken by a message stored by another process (NOTIFY), and a wake-up
  that never came (a message stored without NOTIFY; the LISTEN connection killed) is repaired by
  the fallback check;
- 300 clients trickling a request body in do not stop a normal request from being served.
"""

import asyncio
import resource
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.broker.models import CommitLogEntry, Topic
from apps.broker.services import registry, sending
from tests.conftest import db_url_for_tests, start_gunicorn
from tests.support.listening import hub_listening, listening_hubs
from tests.support.pgwire import StatementCounter
from tests.support.ports import free_port
from tests.support.raw_http import json_request

pytestmark = pytest.mark.e2e

WORKERS = 2
POOL_SIZE = 4
# application_name of the server's pooled connections and of its LISTEN connections: other
# servers of the test session (the `gunicorn` fixture's) listen on the same database.
WEB_APP = "txhub-web-test"
LISTEN_APP = f"{WEB_APP}-wakeups"


@pytest.fixture(autouse=True)
def _enough_file_descriptors() -> None:
    # 800 sockets in this process, ~400 in each web worker (which inherit the limit).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def serve(database_url: str = "", **env: str) -> Iterator[tuple[int, dict[str, str]]]:
    registry.topic_create(name="idle", queues=4)
    registry.topic_create(name="busy", queues=4)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    registry.consumer_group_create(name="billing", max_delivery_attempts=16, consume_from="first")
    _, raw = registry.token_create(name="t", scopes=["admin"])
    port = free_port()
    web = start_gunicorn(
        port,
        workers=WORKERS,
        threads=16,
        extra_env={
            "DATABASE_URL": database_url or f"{db_url_for_tests()}?application_name={WEB_APP}",
            "TXHUB_DB_POOL_SIZE": str(POOL_SIZE),
            # The cost of many waits, not tenants: the one token may hold them all (decision
            # 0084 caps a token's waits per process at 64 by default).
            "TXHUB_MAX_WAITS_PER_TOKEN": "1000",
            **env,
        },
    )
    try:
        yield port, {"Authorization": f"Bearer {raw}"}
    finally:
        web.terminate()
        web.wait(timeout=60)


@pytest.fixture
def web(transactional_db: None) -> Iterator[tuple[int, dict[str, str]]]:
    yield from serve()


@pytest.fixture
def web_no_fallback(transactional_db: None) -> Iterator[tuple[int, dict[str, str]]]:
    """A fallback check every 60 s: a waiter answered sooner was woken by a NOTIFY."""
    yield from serve(TXHUB_LONG_POLL_FALLBACK="60")


def server_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name IN (%s, %s)",
            [WEB_APP, LISTEN_APP],
        )
        return int(cursor.fetchone()[0])


async def http(port: int, method: str, path: str, headers: dict[str, str], body: Any) -> Any:
    """One request on its own connection: (status, JSON answer, seconds)."""
    started = time.monotonic()
    status, answer, answered = await json_request(port, method, path, headers, body)
    return status, answer, answered - started


def send_and_time(port: int, headers: dict[str, str], count: int) -> list[float]:
    times = []
    with requests.Session() as session:
        for i in range(count):
            started = time.monotonic()
            answer = session.post(
                f"http://127.0.0.1:{port}/api/v1/topics/busy/messages",
                headers=headers,
                json={"producer_group": "shop", "body": f"m{i}"},
                timeout=30,
            )
            times.append(time.monotonic() - started)
            assert answer.status_code == 201, answer.text
    return times


@pytest.mark.timeout(180)
@pytest.mark.perf
def test_500_waiting_consumers_hold_no_thread_and_no_connection(web: Any) -> None:
    port, headers = web
    path = "/api/v1/consumer-groups/billing/receive"
    wait = 5
    latencies: list[float] = []
    samples: list[int] = []

    def produce() -> None:
        # While the 500 arrive and wait: their first tries run in the receive threads of each web
        # process, never in front of a send.
        time.sleep(1.0)
        latencies.extend(send_and_time(port, headers, 100))

    def watch(stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                samples.append(server_connections())
                time.sleep(0.1)
        finally:
            connection.close()  # this thread's own

    async def one(i: int) -> Any:
        # 500 consumers (re)connecting within 2 s: 250 first tries a second on a shared
        # 2-core machine; each consumer's time is counted from its own start.
        await asyncio.sleep(i * 2.0 / 500)
        return await http(port, "POST", path, headers, {"topic": "idle", "wait_seconds": wait})

    async def everyone() -> list[Any]:
        return await asyncio.gather(*(one(i) for i in range(500)))

    stop = threading.Event()
    producer = threading.Thread(target=produce)
    watcher = threading.Thread(target=watch, args=(stop,))
    producer.start()
    watcher.start()
    try:
        answers = asyncio.run(everyone())
    finally:
        producer.join()
        stop.set()
        watcher.join()
    assert [status for status, _, _ in answers] == [200] * 500
    assert all(answer == {"messages": []} for _, answer, _ in answers)
    slowest = max(seconds for _, _, seconds in answers)
    assert slowest <= wait + 1, f"a waiter was answered after {slowest:.2f} s"
    assert min(seconds for _, _, seconds in answers) >= wait - 0.1  # they did wait
    p99 = statistics.quantiles(latencies, n=100)[98]
    assert p99 < 1.0, f"send p99 {p99:.3f} s with 500 consumers waiting"
    # At most the pool of each web process plus its LISTEN connection, whatever the waiters.
    assert 0 < max(samples) <= WORKERS * (POOL_SIZE + 1), samples


def wait_in_thread(port: int, headers: dict[str, str], seconds: int) -> tuple[list[Any], Any]:
    """A consumer waiting in a thread: (its answer, when it arrived) once joined."""
    got: list[Any] = []

    def run() -> None:
        answer = requests.post(
            f"http://127.0.0.1:{port}/api/v1/consumer-groups/billing/receive",
            headers=headers,
            json={"topic": "idle", "wait_seconds": seconds},
            timeout=seconds + 10,
        )
        got.append((answer.status_code, answer.json(), time.monotonic()))

    thread = threading.Thread(target=run)
    thread.start()
    return got, thread


def waiting_now(port: int, headers: dict[str, str], seconds: int) -> tuple[list[Any], Any]:
    got, thread = wait_in_thread(port, headers, seconds)
    hub_listening(LISTEN_APP)  # the waiter is registered and its process listens: it waits
    assert not got
    return got, thread


def received_bodies(got: list[Any]) -> list[str]:
    [(status, answer, _)] = got
    assert status == 200, answer
    return [m["body"] for m in answer["messages"]]


def test_a_commit_by_another_process_wakes_a_waiting_consumer(web_no_fallback: Any) -> None:
    port, headers = web_no_fallback
    got, thread = waiting_now(port, headers, 20)
    # Committed by this test process, not the server: the wake-up crosses processes.
    started = time.monotonic()
    sending.message_send(
        topic=Topic.objects.get(name="idle"),
        message=sending.OutgoingMessage(producer_group="shop", body=b"woken", body_is_binary=False),
    )
    thread.join()
    assert received_bodies(got) == ["woken"]
    # Well before both the wait (20 s) and the fallback check (60 s): the NOTIFY woke it.
    assert got[0][2] - started < 5


def test_a_killed_listen_connection_reconnects_and_wakes_again(web_no_fallback: Any) -> None:
    port, headers = web_no_fallback
    got, thread = waiting_now(port, headers, 20)
    before = listening_hubs(LISTEN_APP)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s AND datname = current_database()",
            [LISTEN_APP],
        )
        killed = cursor.fetchone()[0]
    assert killed >= 1
    hub_listening(LISTEN_APP, besides=frozenset(before))  # reconnected, and its catch-up check ran
    started = time.monotonic()
    sending.message_send(
        topic=Topic.objects.get(name="idle"),
        message=sending.OutgoingMessage(
            producer_group="shop", body=b"after reconnect", body_is_binary=False
        ),
    )
    thread.join()
    assert received_bodies(got) == ["after reconnect"]
    assert got[0][2] - started < 5
    assert server_connections() <= WORKERS * (POOL_SIZE + 1)


def store_without_notify(topic_name: str, body: str) -> None:
    """A message appended by raw SQL that announces nothing: a lost NOTIFY."""
    topic = Topic.objects.get(name=topic_name)
    now = timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE broker_messagequeue SET next_offset = next_offset + 1 "
            "WHERE topic_id = %s AND queue_id = 0 RETURNING next_offset - 1",
            [topic.pk],
        )
        [offset] = cursor.fetchone()
        CommitLogEntry.objects.create(
            msg_id=uuid.uuid4().hex.upper(),
            topic=topic,
            queue_id=0,
            queue_offset=offset,
            producer_group="shop",
            body=body.encode(),
            born_at=now,
            stored_at=now,
        )


def test_a_lost_notify_is_repaired_by_the_fallback_check(web: Any) -> None:
    port, headers = web  # fallback check every TXHUB_LONG_POLL_FALLBACK = 1 s
    got, thread = waiting_now(port, headers, 15)
    started = time.monotonic()
    store_without_notify("idle", "never announced")
    thread.join()
    assert received_bodies(got) == ["never announced"]
    assert got[0][2] - started < 5  # the fallback check (1 s), not the end of the wait (15 s)


@pytest.mark.perf
def test_300_trickling_requests_do_not_stop_a_normal_request(web: Any) -> None:
    port, headers = web

    async def run() -> float:
        held = []
        for _ in range(300):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /api/v1/topics/busy/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                + f"Authorization: {headers['Authorization']}\r\n".encode()
                + b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                + b'{"producer_group": "shop", "bo'
            )
            await writer.drain()
            held.append(writer)
        await asyncio.sleep(1)  # each is stuck in the middle of its body
        try:
            answers = [
                await http(
                    port,
                    "POST",
                    "/api/v1/topics/busy/messages",
                    headers,
                    {"producer_group": "shop", "body": f"normal {i}"},
                )
                for i in range(20)
            ]
            assert [status for status, _, _ in answers] == [201] * 20
            return float(max(seconds for _, _, seconds in answers))
        finally:
            for writer in held:
                writer.close()

    slowest = asyncio.run(run())
    assert slowest < 1.0, f"a normal request took {slowest:.2f} s beside 300 trickling ones"


@pytest.fixture
def web_counted(transactional_db: None) -> Iterator[tuple[int, dict[str, str], StatementCounter]]:
    """A server whose every Postgres connection passes a proxy that counts its statements: what
    this server asked, exactly and at once (Postgres's own counts are per database, every
    session's, and reported up to 10 s late). Cached configuration is kept 120 s: none of it
    expires during the test."""
    db = connection.settings_dict
    counter = StatementCounter((db["HOST"], int(db["PORT"])))
    url = (
        f"postgres://{db['USER']}@127.0.0.1:{counter.port}/{db['NAME']}"
        f"?application_name={WEB_APP}&sslmode=disable&gssencmode=disable"
    )
    try:
        for port, headers in serve(url, TXHUB_CONFIG_CACHE_SECONDS="120"):
            yield port, headers, counter
    finally:
        counter.close()


async def receive_again_and_again(
    port: int, headers: dict[str, str], consumers: int, wait: int, keep_going: Any
) -> list[int]:
    """`consumers` consumers, each asking again as soon as it is answered, while `keep_going()`."""

    async def one() -> list[int]:
        statuses: list[int] = []
        while keep_going(len(statuses)):
            status, _, _ = await http(
                port,
                "POST",
                "/api/v1/consumer-groups/billing/receive",
                headers,
                {"topic": "idle", "wait_seconds": wait},
            )
            statuses.append(status)
        return statuses

    answers = await asyncio.gather(*(one() for _ in range(consumers)))
    return [status for statuses in answers for status in statuses]


@pytest.mark.timeout(120)
def test_consumers_asking_again_on_an_empty_topic_cost_postgres_almost_nothing(
    web_counted: Any,
) -> None:
    # Docs/decisions/0026: the token, group, topic and binding come from each process's cache,
    # and the try is skipped while the hub knows the pair is empty. Without both, each of these
    # receives is 5 or more statements.
    port, headers, counter = web_counted
    consumers, rounds = 50, 4
    # A few consumers that never stop (as in production): each web process keeps waiters, so its
    # fallback check keeps renewing what it knows to be empty.
    stop = threading.Event()
    background: list[int] = []

    def steady() -> None:
        background.extend(
            asyncio.run(receive_again_and_again(port, headers, 8, 3, lambda _: not stop.is_set()))
        )

    steady_thread = threading.Thread(target=steady)
    steady_thread.start()
    try:
        warm = asyncio.run(receive_again_and_again(port, headers, consumers, 1, lambda n: n < 2))
        assert set(warm) == {200}
        before, started = counter.snapshot(), time.monotonic()
        answers = asyncio.run(
            receive_again_and_again(port, headers, consumers, 1, lambda n: n < rounds)
        )
        after, elapsed = counter.snapshot(), time.monotonic() - started
        assert answers == [200] * (consumers * rounds)
    finally:
        stop.set()
        steady_thread.join()
    assert background
    assert set(background) == {200}
    assert counter.errors == []
    # Positive control: the warm-up's first tries went through the proxy and were counted.
    assert before["pool"] >= 5, before
    assert before["listen"] >= 2, before
    receives = after["pool"] - before["pool"]
    checks = after["listen"] - before["listen"]
    # Each receive that tried would be a statement at least (the check of its queues), and five
    # more without the cache: 200 to 1,000 here.
    assert receives < consumers * rounds / 8, (
        f"{receives} statements for {consumers * rounds} receives"
    )
    # The fallback checks: at most two statements (revoked tokens, receivable pairs) a period per
    # web process, whatever the number of waiters.
    periods = elapsed / settings.TXHUB_LONG_POLL_FALLBACK + 1
    assert checks <= 2 * WORKERS * periods, f"{checks} statements in {elapsed:.1f} s of checks"


def test_a_revoked_token_and_a_new_binding_hold_at_once_on_every_web_process(web: Any) -> None:
    port, admin = web
    _, raw = registry.token_create(name="consumer", scopes=["consume:billing"])
    consumer = {"Authorization": f"Bearer {raw}"}
    body = {"topic": "idle"}
    path = "/api/v1/consumer-groups/billing/receive"

    def on_new_connections(headers: dict[str, str], times: int = 20) -> list[int]:
        # A connection each: the web processes take turns accepting them.
        async def all_of_them() -> list[Any]:
            return await asyncio.gather(
                *(http(port, "POST", path, headers, body) for _ in range(times))
            )

        return [status for status, _, _ in asyncio.run(all_of_them())]

    assert on_new_connections(consumer) == [200] * 20  # every process keeps token and group
    status, _, _ = asyncio.run(
        http(port, "PUT", "/api/v1/consumer-groups/billing/topics", admin, {"topics": ["busy"]})
    )
    assert status == 200
    assert on_new_connections(consumer) == [403] * 20
    token = registry.token_create(name="revoked", scopes=["consume:billing"])
    revoked = {"Authorization": f"Bearer {token[1]}"}
    status, _, _ = asyncio.run(
        http(port, "PUT", "/api/v1/consumer-groups/billing/topics", admin, {"topics": []})
    )
    assert status == 200
    assert on_new_connections(revoked) == [200] * 20
    answer = requests.delete(
        f"http://127.0.0.1:{port}/api/v1/tokens/{token[0].pk}", headers=admin, timeout=10
    )
    assert answer.status_code == 204, answer.text
    assert on_new_connections(revoked) == [401] * 20


def test_a_consumer_asking_again_gets_a_message_whose_invisible_time_ran_out(web: Any) -> None:
    # No NOTIFY announces an expiry: the hub's fallback check finds it, and wakes a receive that
    # skipped its try because the pair was known empty.
    port, headers = web
    sending.message_send(
        topic=Topic.objects.get(name="idle"),
        message=sending.OutgoingMessage(producer_group="shop", body=b"again", body_is_binary=False),
    )
    path = f"http://127.0.0.1:{port}/api/v1/consumer-groups/billing/receive"
    first = requests.post(
        path, headers=headers, json={"topic": "idle", "invisible_seconds": 10}, timeout=10
    ).json()["messages"]
    assert [m["body"] for m in first] == ["again"]
    received_at = time.monotonic()
    again: list[Any] = []
    while not again and time.monotonic() - received_at < 30:
        answer = requests.post(
            path, headers=headers, json={"topic": "idle", "wait_seconds": 3}, timeout=10
        )
        assert answer.status_code == 200, answer.text
        again = answer.json()["messages"]
    assert [m["body"] for m in again] == ["again"]
    assert again[0]["delivery_attempt"] == 2
    # Visible again after 10 s; found within a fallback period (1 s) and a margin.
    assert time.monotonic() - received_at < 10 + 4
