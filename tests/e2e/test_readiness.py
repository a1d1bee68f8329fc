"""/readyz through a real server: 200 while Postgres and the Celery broker answer, 503 in the
probe's JSON (naming the part that failed) while either does not, and 200 again once it is back.
The faults are on servers of the test's own (`private_cluster`, `private_redis`, a dead port),
never `make run`'s.

/readyz is open to anyone, so a flood of it must cost the dependencies nothing per request: one
probe per process per period at most, over one Redis connection per process, and a hung
dependency holds no request thread (docs/decisions/0086)."""

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from django.db import connection

from tests.conftest import start_gunicorn
from tests.e2e.conftest import PrivateRedis
from tests.support.pgwire import StatementCounter
from tests.support.ports import free_port
from tests.support.waiting import wait_until

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
        assert answer.headers["Retry-After"] == "1"  # as every 503 (decision 0086)
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
            # A probe's reading is reused for a period, and a probe waits at most its timeout
            # for a connection: 503 within about a period (decision 0086).
            answer = wait_until(lambda: _readyz_if(cluster.base, 503), timeout=TURNS_WITHIN)
            assert answer["checks"]["postgres"].startswith("error: ")
            assert answer["checks"]["redis"] == "ok"
        finally:
            cluster.pg_start()
        wait_until(lambda: _readyz_if(cluster.base, 200), timeout=30)
    finally:
        os.killpg(cluster.web.pid, signal.SIGTERM)
        cluster.web.wait(timeout=30)
        cluster.web = None


# A probe's reading is reused for PERIOD seconds; a probe's step gives up after TIMEOUT
# (txhub/readiness.py). Readiness follows a dependency within their sum, plus the test's slack.
PERIOD, TIMEOUT = 1.0, 2.0
TURNS_WITHIN = PERIOD + TIMEOUT + 2.0
WORKERS = 2


def _readyz_if(base: str, status: int) -> dict[str, Any] | None:
    """/readyz's JSON if it answered `status` (a 503 Response itself is falsy)."""
    answer = requests.get(base + "/readyz", timeout=30)
    if answer.status_code != status:
        return None
    if status == 503:
        assert answer.headers["Retry-After"] == "1", answer.headers
    body: dict[str, Any] = answer.json()
    return body


def _flood(base: str, count: int, at_once: int) -> tuple[list[int], float, float]:
    """`count` GET /readyz, `at_once` at a time, each on a connection of its own: their
    statuses, the slowest one's seconds, and the seconds all took."""

    def one(_: int) -> tuple[int, float]:
        started = time.monotonic()
        status = requests.get(base + "/readyz", timeout=60).status_code
        return status, time.monotonic() - started

    started = time.monotonic()
    with ThreadPoolExecutor(at_once) as pool:
        answers = list(pool.map(one, range(count)))
    return [status for status, _ in answers], max(s for _, s in answers), time.monotonic() - started


def _hammer(base: str, seconds: float, at_once: int) -> list[tuple[float, int, float, Any]]:
    """GET /readyz from `at_once` threads, each asking again as soon as it is answered, for
    `seconds`: each answer's (when it was asked, status, seconds it took, JSON)."""
    until = time.monotonic() + seconds

    def asking() -> list[tuple[float, int, float, Any]]:
        answers = []
        with requests.Session() as session:
            while (started := time.monotonic()) < until:
                answer = session.get(base + "/readyz", timeout=60)
                took = time.monotonic() - started
                answers.append((started, answer.status_code, took, answer.json()))
        return answers

    with ThreadPoolExecutor(at_once) as pool:
        threads = [pool.submit(asking) for _ in range(at_once)]
        return [answer for thread in threads for answer in thread.result()]


def _connections_received(redis: PrivateRedis) -> int:
    """Connections the Redis server has accepted since it started (this question's included)."""
    for line in redis.cli("info", "stats").splitlines():
        if line.startswith("total_connections_received:"):
            return int(line.split(":")[1])
    raise AssertionError("INFO stats has no total_connections_received")


@pytest.fixture
def counted_web(
    transactional_db: None, private_redis: PrivateRedis
) -> Iterator[tuple[str, StatementCounter, PrivateRedis]]:
    """A server (WORKERS processes) whose Postgres statements pass a counting proxy (decision
    0062) and whose Celery broker is a Redis of this test's own."""
    db = connection.settings_dict
    counter = StatementCounter((db["HOST"], int(db["PORT"])))
    url = (
        f"postgres://{db['USER']}@127.0.0.1:{counter.port}/{db['NAME']}"
        "?sslmode=disable&gssencmode=disable"
    )
    port = free_port()
    env = {"DATABASE_URL": url, "CELERY_BROKER_URL": private_redis.url(0)}
    web = start_gunicorn(port, workers=WORKERS, extra_env=env)
    try:
        yield f"http://127.0.0.1:{port}", counter, private_redis
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        web.wait(timeout=30)
        counter.close()


def test_a_readyz_flood_costs_one_probe_per_process_per_period(
    counted_web: tuple[str, StatementCounter, PrivateRedis],
) -> None:
    base, counter, redis = counted_web
    statuses, _, _ = _flood(base, 40, 8)  # every process has answered once
    assert set(statuses) == {200}
    time.sleep(PERIOD + 0.2)  # their readings are old: the flood's first requests probe again
    statements, connections = counter.snapshot()["pool"], _connections_received(redis)

    statuses, _, took = _flood(base, 400, 16)

    assert set(statuses) == {200}
    assert counter.errors == []
    probed = counter.snapshot()["pool"] - statements
    opened = _connections_received(redis) - connections - 1  # not the INFO question's own
    # One SELECT 1 per probe, a few more for a pool connection a process opens meanwhile; the
    # code before decision 0086 ran one per request and opened a Redis connection for each.
    periods = took / PERIOD + 1
    assert 1 <= probed <= 2 * WORKERS * (periods + 1), (probed, took)
    assert opened <= WORKERS, opened

    # Redis stopped and started again: readiness follows within about a period, and each
    # process's shared client, finding its connection dead, makes one new one.
    redis.shutdown()
    answer = wait_until(lambda: _readyz_if(base, 503), timeout=TURNS_WITHIN, interval=0.1)
    assert answer["checks"]["redis"].startswith("error: "), answer
    redis.start()
    # Until a flood as large as the one measured below is all 200: a process that a smaller flood
    # did not reach still serves its reading from the outage while it probes again (0086).
    wait_until(lambda: set(_flood(base, 100, 16)[0]) == {200}, timeout=TURNS_WITHIN, interval=0.1)
    connections = _connections_received(redis)
    statuses, _, _ = _flood(base, 100, 16)
    assert set(statuses) == {200}
    assert _connections_received(redis) - connections - 1 <= WORKERS


def test_a_hung_redis_turns_readyz_503_and_holds_no_request_meanwhile(
    counted_web: tuple[str, StatementCounter, PrivateRedis],
) -> None:
    base, _, redis = counted_web
    assert redis.process is not None
    statuses, _, _ = _flood(base, 40, 8)  # every process has a reading
    assert set(statuses) == {200}
    os.kill(redis.process.pid, signal.SIGSTOP)  # accepts connections, answers nothing
    try:
        stopped = time.monotonic()
        hung = _hammer(base, TURNS_WITHIN + 1, 8)
    finally:
        os.kill(redis.process.pid, signal.SIGCONT)
    resumed = time.monotonic()
    back = _hammer(base, TURNS_WITHIN + 1, 4)

    # No request waited for the hung probe (before decision 0086 each waited out a socket
    # timeout of its own, in one of the server's threads, three times over with redis-py's
    # retries), and each process turned 503 within about a period, naming Redis.
    assert max(took for _, _, took, _ in hung) < 1.0
    late = [(status, body) for started, status, _, body in hung if started > stopped + TURNS_WITHIN]
    assert late, "nothing asked after the bound"
    assert {status for status, _ in late} == {503}, late
    assert all(body["checks"]["postgres"] == "ok" for _, body in late)
    assert all(body["checks"]["redis"].startswith("error: ") for _, body in late)
    # ... and 200 again within about a period of Redis answering.
    again = [status for started, status, _, _ in back if started > resumed + TURNS_WITHIN]
    assert again, "nothing asked after the bound"
    assert set(again) == {200}
