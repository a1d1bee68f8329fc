"""Bad bearer tokens are cheap to refuse (issue 24, item 6; docs/decisions/0038), through a real
server on a Postgres of the test's own: a junk token refused once is refused again without any
lookup (it answers 401 while Postgres is down, where a lookup would answer 503), and past its
failed authentications an address's unknown tokens get 429 before any lookup, while a token
the process knows as good is still served. Both doors count an address's failures: the lean
door's prepare as DRF's."""

import http.client
import json
import math
import os
import secrets
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from apps.broker.api.errors import retry_after_seconds
from apps.broker.models import HalfMessage
from apps.broker.services import registry
from tests.conftest import start_gunicorn
from tests.support.metrics import METRICS_HEADERS
from tests.support.ports import free_port

pytestmark = pytest.mark.e2e


def test_junk_tokens_are_refused_without_lookups_and_throttled_per_address(
    private_cluster: Any,
) -> None:
    cluster = private_cluster
    good = cluster.manage("create_token", "junk-test", "--scope", "admin").strip()
    cluster.web_start(TXHUB_AUTH_FAILURES_PER_MINUTE="5")
    topics = f"{cluster.base}/api/v1/topics"

    def get(token: str) -> int:
        answer = requests.get(topics, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        # Refused on the event loop or not, an answer says its length (never chunked).
        assert answer.headers.get("Content-Length") == str(len(answer.content)), answer.headers
        return int(answer.status_code)

    def junk() -> str:
        return "txh_" + secrets.token_urlsafe(32)

    try:
        assert get(good) == 200  # now known as good in the (one) web process
        repeated = junk()
        assert get(repeated) == 401
        cluster.pg_stop("fast")
        try:
            assert get(repeated) == 401  # remembered: no lookup
            assert get(junk()) == 503  # the positive control: a new one needs Postgres
        finally:
            cluster.pg_start()
        assert [get(junk()) for _ in range(4)] == [401] * 4  # 5 failures: the budget
        cluster.pg_stop("fast")
        try:
            throttled = requests.get(
                topics, headers={"Authorization": f"Bearer {junk()}"}, timeout=30
            )
            assert throttled.status_code == 429  # before any lookup: not 503
            assert throttled.json()["error"]["code"] == "throttled"
            assert int(throttled.headers["Retry-After"]) >= 1
            assert throttled.headers["Content-Length"] == str(len(throttled.content))
        finally:
            cluster.pg_start()
        assert get(good) == 200  # the good token from the same address is served
    finally:
        os.killpg(cluster.web.pid, signal.SIGTERM)
        cluster.web.wait(timeout=30)
        cluster.web = None


@pytest.fixture
def one_web_process(transactional_db: None) -> Iterator[tuple[int, str]]:
    """One web process (failures are counted per process) with a budget of 5 a minute."""
    registry.topic_create(name="orders", queues=1)
    registry.producer_group_create(name="shop", check_url="https://127.0.0.1:9/")
    _, raw = registry.token_create(name="shop", scopes=["produce:shop"])
    port = free_port()
    process = start_gunicorn(
        port, workers=1, extra_env={"TXHUB_AUTH_FAILURES_PER_MINUTE": str(BUDGET)}
    )
    try:
        yield port, raw
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


BUDGET = 5


def _post_from(address: str, port: int, path: str, token: str) -> tuple[int, dict[str, str], bytes]:
    """A prepare sent from `address` (any of 127.0.0.0/8 reaches the server on 127.0.0.1): each
    door's failures are counted per client address, so each door here has an address of its own."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=30, source_address=(address, 0)
    )
    body = json.dumps({"producer_group": "shop", "topic": "orders", "body": "order 9527"})
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    try:
        connection.request("POST", path, body, headers)
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def _lean_answers(port: int) -> float:
    text = requests.get(
        f"http://127.0.0.1:{port}/metrics", headers=METRICS_HEADERS, timeout=30
    ).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("txhub_lean_door_answers_total")
    )


@pytest.mark.parametrize(
    ("door", "address", "path"),
    [
        # The lean door takes a plain prepare; a query string sends the same call to Django
        # (the positive control: DRF's request has always carried REMOTE_ADDR).
        ("lean", "127.0.0.2", "/api/v1/transactions"),
        ("django", "127.0.0.3", "/api/v1/transactions?door=django"),
    ],
)
def test_failed_authentications_are_counted_per_address_at_both_doors(
    one_web_process: tuple[int, str], door: str, address: str, path: str
) -> None:
    port, good = one_web_process
    lean_before = _lean_answers(port)
    started = time.monotonic()
    for attempt in range(BUDGET):
        status, _, _ = _post_from(address, port, path, "txh_" + secrets.token_urlsafe(32))
        assert status == 401
        if attempt == 0:
            first_answered = time.monotonic()
            # A gap of more than a second after the first failure, so that what is left of its
            # minute is seen to shrink (decision 0108).
            time.sleep(1.1)
    last_sent = time.monotonic()
    assert (_lean_answers(port) > lean_before) is (door == "lean")  # which door answered
    status, headers, body = _post_from(address, port, path, "txh_" + secrets.token_urlsafe(32))
    elapsed = time.monotonic() - started
    assert status == 429, body
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert error["code"] == "throttled"
    # Rounded up, at both doors (errors.retry_after_seconds): what is left of the minute since
    # the first failure is more than 60 - elapsed, and a client that waits Retry-After seconds
    # is past it (rounded down, it would be refused again).
    retry_after = int(headers["retry-after"])
    assert retry_after == error["details"]["retry_after"]
    assert 60 - elapsed <= retry_after <= math.ceil(60 - (last_sent - first_answered))
    assert HalfMessage.objects.count() == 0
    # A token the process knows as good is served from that address; another address is not
    # throttled.
    assert _post_from("127.0.0.4", port, path, good)[0] == 201
    assert _post_from(address, port, path, good)[0] == 201


@pytest.mark.parametrize(
    ("wait", "seconds"), [(None, 1), (0.0, 1), (0.2, 1), (1.0, 1), (59.01, 60), (59.99, 60)]
)
def test_retry_after_is_whole_seconds_rounded_up_and_at_least_one(
    wait: float | None, seconds: int
) -> None:
    assert retry_after_seconds(wait) == seconds
