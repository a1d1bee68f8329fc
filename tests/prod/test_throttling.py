"""Per-token rate limits (CONTRACT section 6) on real gunicorns sharing one Redis budget."""

import contextlib
import math
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from rest_framework.test import APIClient

from apps.broker.services import registry
from tests.conftest import start_gunicorn
from tests.support.ports import free_port
from tests.support.throttling import fresh_budget

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

RATE = 5
WINDOW = 60  # "5/min": a burst of a few seconds nearly always sits in one window


def token(name: str, *scopes: str) -> dict[str, str]:
    created, raw = registry.token_create(name=name, scopes=list(scopes or ["admin"]))
    fresh_budget(created.pk, WINDOW)
    fresh_budget(created.pk, 3600)
    return {"Authorization": f"Bearer {raw}"}


@contextlib.contextmanager
def web(**env: str) -> Iterator[str]:
    port = free_port()
    process = start_gunicorn(port, workers=2, threads=4, extra_env=env)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def windows_touched(start: float, end: float) -> int:
    return math.floor(end / WINDOW) - math.floor(start / WINDOW) + 1


def burst(bases: list[str], headers: dict[str, str], n: int) -> tuple[list[Any], int]:
    """n GETs spread round-robin over the servers; the responses and the windows they spanned."""
    start = time.time()
    answers = [
        requests.get(bases[i % len(bases)] + "/api/v1/topics", headers=headers, timeout=30)
        for i in range(n)
    ]
    return answers, windows_touched(start, time.time())


def test_a_burst_over_the_rate_gets_429_with_retry_after_and_other_tokens_are_unaffected(
    transactional_db: None,
) -> None:
    first, second = token("first"), token("second")
    with web(TXHUB_THROTTLE_RATE=f"{RATE}/min") as base:
        answers, windows = burst([base], first, 3 * RATE)
        ok = [a for a in answers if a.status_code == 200]
        throttled = [a for a in answers if a.status_code == 429]
        assert len(ok) + len(throttled) == len(answers)
        assert RATE <= len(ok) <= RATE * windows
        assert throttled
        for answer in throttled:
            retry_after = answer.headers["Retry-After"]
            assert retry_after.isdigit()
            assert 1 <= int(retry_after) <= WINDOW
            error = answer.json()["error"]
            assert error["code"] == "throttled"
            assert error["message"]
            assert error["details"] == {"retry_after": int(retry_after)}
        # Another token has a budget of its own.
        assert requests.get(base + "/api/v1/topics", headers=second, timeout=30).status_code == 200


def test_two_web_servers_share_one_budget(transactional_db: None) -> None:
    headers = token("shared")
    env = {"TXHUB_THROTTLE_RATE": f"{RATE}/min"}
    with web(**env) as one, web(**env) as two:
        answers, windows = burst([one, two], headers, 4 * RATE)
    ok_by_server = [
        sum(1 for i, a in enumerate(answers) if a.status_code == 200 and i % 2 == s) for s in (0, 1)
    ]
    # Both served some, and together no more than one budget per window: a budget per process
    # would let each of them pass RATE.
    assert all(ok_by_server)
    assert RATE <= sum(ok_by_server) <= RATE * windows
    assert {a.status_code for a in answers} == {200, 429}


def test_rate_zero_turns_throttling_off(transactional_db: None) -> None:
    headers = token("unlimited")
    with web(TXHUB_THROTTLE_RATE="0") as base:
        answers, _ = burst([base], headers, 3 * RATE)
    assert {a.status_code for a in answers} == {200}


def test_an_unreachable_cache_fails_open(transactional_db: None) -> None:
    headers = token("cache-down")
    dead = free_port()  # nothing listens there
    with web(
        TXHUB_THROTTLE_RATE=f"{RATE}/min", TXHUB_CACHE_URL=f"redis://127.0.0.1:{dead}/3"
    ) as base:
        answers, _ = burst([base], headers, 3 * RATE)
    assert {a.status_code for a in answers} == {200}


@pytest.mark.django_db
def test_a_long_poll_receive_counts_once_however_long_it_waits(
    setup_topic: Any, settings: Any
) -> None:
    """In process (same throttle, same Redis): each receive below polls Postgres ~10 times while it
    waits; it draws one request from the budget."""
    names = setup_topic()
    settings.TXHUB_THROTTLE_RATE = "3/h"
    consumer = APIClient()
    header = token("poller", f"consume:{names['consumer']}")["Authorization"]
    consumer.credentials(HTTP_AUTHORIZATION=header)
    path = f"/api/v1/consumer-groups/{names['consumer']}/receive"
    start = time.time()
    statuses = [
        consumer.post(path, {"topic": names["topic"], "wait_seconds": 1}, format="json").status_code
        for _ in range(4)
    ]
    if math.floor(time.time() / 3600) != math.floor(start / 3600):
        pytest.skip("the burst crossed an hour boundary")
    assert statuses == [200, 200, 200, 429]


@pytest.mark.django_db
def test_retry_after_does_not_end_before_the_window_does(settings: Any) -> None:
    """In process: Retry-After is the whole seconds left in the token's window, rounded up, so a
    client that waits that long is past the window; rounded down, it would come back inside it
    and be throttled again."""
    settings.TXHUB_THROTTLE_RATE = "1/h"
    admin = APIClient()
    admin.credentials(HTTP_AUTHORIZATION=token("patient")["Authorization"])
    start = time.time()
    assert admin.get("/api/v1/topics").status_code == 200
    throttled = admin.get("/api/v1/topics")
    answered = time.time()
    if math.floor(answered / 3600) != math.floor(start / 3600):
        pytest.skip("the calls crossed an hour boundary")
    assert throttled.status_code == 429
    window_end = (math.floor(start / 3600) + 1) * 3600
    retry_after = int(throttled["Retry-After"])
    assert answered + retry_after >= window_end
    assert retry_after <= math.ceil(window_end - start)


@pytest.mark.django_db
def test_a_client_that_waits_retry_after_is_served_in_the_next_window(settings: Any) -> None:
    """In process, at "2/s": the window is the rate's period, so each 429's Retry-After (1 s)
    brings the client into a new window with a whole budget (decision 0108). Three rounds: a
    window twice as long would hold at least one of them back."""
    settings.TXHUB_THROTTLE_RATE = "2/s"
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=token("rounds")["Authorization"])
    for _ in range(3):
        answers = [client.get("/api/v1/topics")]
        while answers[-1].status_code != 429:
            answers.append(client.get("/api/v1/topics"))
            assert len(answers) <= 6, answers  # two windows' budgets at most
        throttled = answers[-1]
        assert throttled["Retry-After"] == "1"
        time.sleep(int(throttled["Retry-After"]))
        assert client.get("/api/v1/topics").status_code == 200


def test_the_lean_door_counts_in_the_same_budget_and_answers_429_the_same_way(
    transactional_db: None,
) -> None:
    """Receives (answered by the lean door, apps/broker/api/lean.py) and GETs (Django) draw
    from one budget per token, and the lean door's 429 is the contract's, with Retry-After."""
    admin = token("lean-admin")
    with web(TXHUB_THROTTLE_RATE=f"{RATE}/min") as base:
        for path, body in (
            ("/api/v1/topics", {"name": "lean-throttle", "queues": 1}),
            ("/api/v1/consumer-groups", {"name": "lean-throttle"}),
        ):
            assert requests.post(base + path, json=body, headers=admin, timeout=30).ok
        start = time.time()
        answers = [
            requests.post(
                base + "/api/v1/consumer-groups/lean-throttle/receive",
                json={"topic": "lean-throttle"},
                headers=admin,
                timeout=30,
            )
            for _ in range(2 * RATE)
        ]
        windows = windows_touched(start, time.time())
        assert {a.status_code for a in answers} == {200, 429}
        assert RATE - 2 <= sum(a.status_code == 200 for a in answers) <= RATE * windows
        for answer in (a for a in answers if a.status_code == 429):
            retry_after = answer.headers["Retry-After"]
            assert 1 <= int(retry_after) <= WINDOW
            assert answer.json()["error"] == {
                "code": "throttled",
                "message": answer.json()["error"]["message"],
                "details": {"retry_after": int(retry_after)},
            }
            assert answer.json()["error"]["message"].startswith("Request was throttled")
        if windows == 1:  # the budget the receives spent is the GETs' budget too
            assert (
                requests.get(base + "/api/v1/topics", headers=admin, timeout=30).status_code == 429
            )
