"""Slow and greedy clients through a real server as `make run` starts it (issue 24, item 3;
docs/decisions/0033): connections that never finish a request are closed at the read deadline
while producers keep being served, a head too large is 431 (however it arrives: trickled or in
one read, a long URL or long headers), a request that is not HTTP is 400, each in the API's JSON
error format, and past the connection limit new
requests are answered 503 until the slow ones are gone."""

import contextlib
import json
import resource
import selectors
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from apps.broker.services import registry
from tests.conftest import start_gunicorn
from tests.support.ports import free_port

pytestmark = pytest.mark.e2e

DEADLINE = 2.0


@pytest.fixture(autouse=True)
def _enough_file_descriptors() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def serve(**env: str) -> Iterator[tuple[int, dict[str, str]]]:
    registry.topic_create(name="orders", queues=2)
    registry.producer_group_create(name="shop", check_url="https://127.0.0.1:9/")
    _, raw = registry.token_create(name="t", scopes=["produce:shop"])
    port = free_port()
    process = start_gunicorn(
        port,
        workers=1,
        extra_env={"TXHUB_WEB_REQUEST_READ_SECONDS": str(DEADLINE), **env},
    )
    try:
        yield port, {"Authorization": f"Bearer {raw}"}
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


@pytest.fixture
def web(transactional_db: None) -> Iterator[tuple[int, dict[str, str]]]:
    yield from serve()


@pytest.fixture
def small_web(transactional_db: None) -> Iterator[tuple[int, dict[str, str]]]:
    yield from serve(TXHUB_WEB_MAX_CONNECTIONS="20")


def prepare_and_commit(port: int, headers: dict[str, str]) -> tuple[int, int]:
    base = f"http://127.0.0.1:{port}/api/v1"
    prepared = requests.post(
        f"{base}/transactions",
        json={"producer_group": "shop", "topic": "orders", "body": "order 9527"},
        headers=headers,
        timeout=10,
    )
    if prepared.status_code != 201:
        return prepared.status_code, 0
    tx = prepared.json()["transaction_id"]
    committed = requests.post(f"{base}/transactions/{tx}/commit", headers=headers, timeout=10)
    return prepared.status_code, committed.status_code


def slow_lorises(port: int, count: int) -> list[socket.socket]:
    """Connections that send the start of a request's head and never the rest."""
    opened = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"POST /api/v1/transactions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1")
        opened.append(sock)
    return opened


def closed_by_the_server(sockets: list[socket.socket], timeout: float) -> int:
    """How many of the sockets the server closed (EOF, after an answer or not) by `timeout`.
    epoll, not select(): this process may hold file descriptors above 1024."""
    watcher = selectors.DefaultSelector()
    for sock in sockets:
        watcher.register(sock, selectors.EVENT_READ)
    open_ones = len(sockets)
    deadline = time.monotonic() + timeout
    while open_ones and time.monotonic() < deadline:
        for key, _ in watcher.select(0.5):
            ready = key.fileobj
            assert isinstance(ready, socket.socket)
            try:
                data = ready.recv(4096)
            except ConnectionResetError:
                data = b""
            if not data or data.endswith(b"\r\n\r\n"):
                watcher.unregister(ready)
                open_ones -= 1
    watcher.close()
    for sock in sockets:
        sock.close()
    return len(sockets) - open_ones


def test_a_thousand_slow_lorises_are_closed_at_the_deadline_and_producers_are_served(
    web: Any,
) -> None:
    port, headers = web
    started = time.monotonic()
    lorises = slow_lorises(port, 1000)
    answers = [prepare_and_commit(port, headers) for _ in range(5)]
    assert answers == [(201, 200)] * 5
    closed = closed_by_the_server(lorises, timeout=DEADLINE + 10)
    assert closed == 1000, f"{1000 - closed} slow connections were still open"
    assert time.monotonic() - started < DEADLINE + 10
    assert prepare_and_commit(port, headers) == (201, 200)


def test_a_connection_that_sends_nothing_is_answered_408_and_closed(web: Any) -> None:
    port, _ = web
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(DEADLINE + 10)
        answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert sock.recv(4096) == b""


def test_a_request_head_over_the_limit_is_431(web: Any) -> None:
    port, headers = web
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(10)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        try:
            for _ in range(200):  # 200 x 1 KiB of headers, past the 64 KiB limit
                sock.sendall(b"X-Padding: " + b"p" * 1000 + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 431"), answer
    assert b"content-type: application/json" in answer
    # The positive control: a head within the limit is served.
    ok = requests.get(
        f"http://127.0.0.1:{port}/healthz", headers={"X-Padding": "p" * 30_000}, timeout=10
    )
    assert ok.status_code == 200


def raw_answer(port: int, request: bytes) -> tuple[bytes, dict[str, str], dict[str, Any]]:
    """Sends `request` in one write; the status line, headers and JSON body of the answer."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(10)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        answer = b""
        # The server closes with some of the request unread: its RST may end the read early.
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return status.encode(), headers, json.loads(body)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"p" * 70_000 + b"\r\n\r\n",
        b"GET /api/v1/transactions?" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"POST /api/v1/transactions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n"
        + b"X-Padding: "
        + b"p" * 70_000
        + b"\r\n\r\n{}",
    ],
    ids=["long-header", "long-url", "long-header-with-a-body"],
)
def test_a_head_over_the_limit_in_one_read_is_a_json_431(web: Any, request_bytes: bytes) -> None:
    port, headers = web
    status, answer_headers, body = raw_answer(port, request_bytes)
    assert status.startswith(b"HTTP/1.1 431"), status
    assert answer_headers["content-type"] == "application/json"
    assert answer_headers["connection"] == "close"
    assert body["error"]["code"] == "headers_too_large"
    # The positive control: the same in a head within the limit, and a body past it is no head.
    ok = requests.get(
        f"http://127.0.0.1:{port}/healthz", headers={"X-Padding": "p" * 60_000}, timeout=10
    )
    assert ok.status_code == 200
    assert prepare_and_commit(port, headers) == (201, 200)
    big_body = requests.post(
        f"http://127.0.0.1:{port}/api/v1/transactions",
        json={"producer_group": "shop", "topic": "orders", "body": "x" * 200_000},
        headers=headers,
        timeout=10,
    )
    assert big_body.status_code == 201


def test_a_request_that_is_not_http_is_a_json_400(web: Any) -> None:
    status, answer_headers, body = raw_answer(web[0], b"NOT HTTP AT ALL\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400"), status
    assert answer_headers["content-type"] == "application/json"
    assert body["error"]["code"] == "invalid_request"


def test_past_the_connection_limit_requests_are_503_until_the_slow_ones_are_gone(
    small_web: Any,
) -> None:
    port, headers = small_web
    lorises = slow_lorises(port, 25)
    refused = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
    assert refused.status_code == 503
    assert closed_by_the_server(lorises, timeout=DEADLINE + 10) == 25
    assert prepare_and_commit(port, headers) == (201, 200)


def test_empty_lines_after_an_answer_do_not_keep_the_connection_open(web: Any) -> None:
    """Empty lines before a request are no part of it (the parser skips them) but start its read
    deadline (docs/decisions/0077): a connection that sends only those after an answer is closed
    at the deadline, as one that sends half a head."""
    port, _ = web
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(10)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.settimeout(0.5)
        started = time.monotonic()
        answer = b""
        while time.monotonic() - started < DEADLINE + 8:
            sock.sendall(b"\r\n")
            try:
                answer = sock.recv(4096)
                break
            except TimeoutError:
                continue
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert time.monotonic() - started < DEADLINE + 3
