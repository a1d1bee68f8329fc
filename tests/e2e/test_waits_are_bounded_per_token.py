"""One token cannot hold every waiting receive of a web process (docs/decisions/0084): through a
real server as `make run` starts it, with TXHUB_MAX_WAITS_PER_TOKEN=3, a token's fourth long poll
at once is refused 429 `throttled` with Retry-After, while another tenant's receive still waits
and its send is stored; once the first token's waits have ended it may wait again. The same
through the lean door and through Django's (TXHUB_LEAN_DOOR=0). And past uvicorn's own
connection limit the 503 is the contract's JSON, not uvicorn's plain text."""

import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from apps.broker.services import registry
from tests.conftest import start_gunicorn
from tests.support.ports import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

CAP = 3
HELD_SECONDS = 8  # how long the first token's waits last: the rest of the test runs meanwhile


class Web:
    def __init__(self, port: int, hog: str, victim: str) -> None:
        self.base = f"http://127.0.0.1:{port}/api/v1"
        self.hog = {"Authorization": f"Bearer {hog}"}
        self.victim = {"Authorization": f"Bearer {victim}"}

    def receive(self, group: str, headers: dict[str, str], wait: float) -> requests.Response:
        """The hog waits on a topic nothing is sent to; the victim on the one it sends to."""
        topic = "idle" if group == "hog" else "orders"
        return requests.post(
            f"{self.base}/consumer-groups/{group}/receive",
            json={"topic": topic, "max_messages": 1, "wait_seconds": wait},
            headers=headers,
            timeout=30,
        )


def serve(**env: str) -> Iterator[Any]:
    port = free_port()
    process = start_gunicorn(port, workers=1, extra_env=env)
    try:
        yield port
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


@pytest.fixture(params=["1", "0"], ids=["lean-door", "django"])
def web(request: Any, transactional_db: None) -> Iterator[Web]:
    registry.topic_create(name="orders", queues=1)
    registry.topic_create(name="idle", queues=1)
    registry.producer_group_create(name="shop", check_url="https://127.0.0.1:9/")
    for group in ("hog", "victim"):
        registry.consumer_group_create(name=group, max_delivery_attempts=16, consume_from="first")
    _, hog = registry.token_create(name="hog", scopes=["consume:hog"])
    _, victim = registry.token_create(name="victim", scopes=["consume:victim", "produce:shop"])
    env = {"TXHUB_MAX_WAITS_PER_TOKEN": str(CAP), "TXHUB_LEAN_DOOR": request.param}
    for port in serve(**env):
        yield Web(port, hog, victim)


def test_a_tokens_waits_past_its_cap_are_429_while_another_token_waits_and_sends(
    web: Web,
) -> None:
    with ThreadPoolExecutor(CAP + 1) as pool:
        # One wait more than the cap at once, on a topic nothing is sent to: one is refused at
        # once, the others wait.
        waits = [pool.submit(web.receive, "hog", web.hog, HELD_SECONDS) for _ in range(CAP + 1)]
        [done] = wait_until(lambda: [f for f in waits if f.done()], timeout=HELD_SECONDS - 2)
        answer = done.result()
        assert answer.status_code == 429, answer.text
        assert answer.headers["Content-Type"] == "application/json"
        assert int(answer.headers["Retry-After"]) >= 1
        assert answer.json()["error"]["code"] == "throttled"
        assert answer.json()["error"]["details"]["retry_after"] >= 1
        held = [f for f in waits if f is not done]

        # The positive control: the other tenant's receive waits its second, and its send is
        # stored, while the hog still holds its waits.
        started = time.monotonic()
        waited = web.receive("victim", web.victim, 1)
        assert waited.status_code == 200, waited.text
        assert waited.json() == {"messages": []}
        assert time.monotonic() - started >= 0.9
        sent = requests.post(
            f"{web.base}/topics/orders/messages",
            json={"producer_group": "shop", "body": "order 9527"},
            headers=web.victim,
            timeout=10,
        )
        assert sent.status_code == 201, sent.text
        got = web.receive("victim", web.victim, 1)
        assert [m["body"] for m in got.json()["messages"]] == ["order 9527"]
        assert not any(future.done() for future in held), "the hog's waits ended too early"

        # The hog's own waits were served as waits: each waited its time out.
        for future in held:
            assert future.result(timeout=HELD_SECONDS + 10).json() == {"messages": []}

    started = time.monotonic()
    again = web.receive("hog", web.hog, 1)
    assert again.status_code == 200, again.text
    assert time.monotonic() - started >= 0.9, "the wait after the others ended did not wait"


@pytest.fixture
def small_web(transactional_db: None) -> Iterator[int]:
    yield from serve(TXHUB_WEB_MAX_CONNECTIONS="5")


def test_past_uvicorns_connection_limit_the_503_is_the_contracts_json(small_web: int) -> None:
    idle = [socket.create_connection(("127.0.0.1", small_web)) for _ in range(6)]
    try:
        refused = requests.get(f"http://127.0.0.1:{small_web}/api/v1/topics", timeout=10)
    finally:
        for sock in idle:
            sock.close()
    assert refused.status_code == 503
    assert refused.headers["Content-Type"] == "application/json"
    assert refused.json()["error"]["code"] == "unavailable"
    assert refused.headers["Retry-After"] == "1"  # as every 503 (docs/decisions/0086)
    served = wait_until(
        lambda: requests.get(f"http://127.0.0.1:{small_web}/healthz", timeout=10).ok, timeout=10
    )
    assert served
