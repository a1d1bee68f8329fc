"""Pipelined requests through a real server as `make run` starts it (docs/decisions/0077): a head
is counted against TXHUB_WEB_MAX_HEADER_BYTES however it arrives, after another request in the
same read included; the answers before a refusal are sent first, in order; and a connection holds
at most MAX_PIPELINED_REQUESTS requests waiting behind the one being answered."""

import contextlib
import json
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from apps.broker.services import registry
from tests.conftest import start_gunicorn
from tests.support.ports import free_port
from txhub.worker import MAX_PIPELINED_REQUESTS

pytestmark = pytest.mark.e2e

SMALL_GET = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
LAST_GET = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def padded_get(padding: int, end: bool = True) -> bytes:
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"p" * padding
    return head + b"\r\n\r\n" if end else head


@pytest.fixture
def web(transactional_db: None) -> Iterator[tuple[int, bytes]]:
    registry.topic_create(name="orders", queues=2)
    registry.producer_group_create(name="shop", check_url="https://127.0.0.1:9/")
    _, raw = registry.token_create(name="t", scopes=["produce:shop"])
    port = free_port()
    process = start_gunicorn(port, workers=1)
    try:
        yield port, f"Authorization: Bearer {raw}\r\n".encode()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def prepare(authorization: bytes, body: bytes, chunked: bool = False) -> bytes:
    head = b"POST /api/v1/transactions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + authorization
    head += b"Content-Type: application/json\r\n"
    if chunked:
        framed = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + framed
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def prepare_body(size: int) -> bytes:
    return json.dumps({"producer_group": "shop", "topic": "orders", "body": "x" * size}).encode()


Answer = tuple[int, bytes, dict[str, str]]


def answers(port: int, *sends: bytes) -> list[Answer]:
    """Each of `sends` in one write (a short pause between them); then every answer until the
    server closes: (status, body, headers with lower-case names) in the order they came."""
    received = b""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(15)
        for number, data in enumerate(sends):
            if number:
                time.sleep(0.3)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(data)
        # The server may close with some of the request unread: its RST may end the read early.
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                received += chunk
    parsed = []
    while received:
        head, _, rest = received.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        length = int(headers["content-length"])
        parsed.append((int(status_line.split()[1]), rest[:length], headers))
        received = rest[length:]
    return parsed


def statuses(found: list[Answer]) -> list[int]:
    return [status for status, *_ in found]


def assert_refused_431(found: list[Answer]) -> None:
    assert json.loads(found[-1][1])["error"]["code"] == "headers_too_large"


def test_a_head_over_the_limit_after_a_small_request_in_the_same_read_is_431(web: Any) -> None:
    port, _ = web
    found = answers(port, SMALL_GET + padded_get(70_000))
    assert statuses(found) == [200, 431]
    assert_refused_431(found)


def test_a_head_begun_in_the_read_of_the_request_before_it_is_counted_from_its_start(
    web: Any,
) -> None:
    port, _ = web
    # 40,000 bytes of the second head arrive with the first request, 30,000 in a later read.
    found = answers(port, SMALL_GET + padded_get(40_000, end=False), b"p" * 30_000 + b"\r\n\r\n")
    assert statuses(found) == [200, 431]
    assert_refused_431(found)


def test_a_head_over_the_limit_after_a_request_with_a_body_in_the_same_read_is_431(
    web: Any,
) -> None:
    port, authorization = web
    found = answers(port, prepare(authorization, prepare_body(100)) + padded_get(70_000))
    assert statuses(found) == [201, 431]
    assert_refused_431(found)


def test_empty_lines_before_a_request_do_not_hide_its_head(web: Any) -> None:
    port, _ = web
    found = answers(port, b"\r\n\r\n\r\n" + padded_get(70_000))
    assert statuses(found) == [431]
    assert_refused_431(found)


def test_pipelined_requests_within_the_limits_are_all_answered_in_order(web: Any) -> None:
    port, authorization = web
    # A 40 KB body then a 40 KB head: each within the limit, their sum past it.
    found = answers(
        port,
        SMALL_GET
        + padded_get(60_000)
        + prepare(authorization, prepare_body(40_000))
        + padded_get(40_000)
        + prepare(authorization, prepare_body(100), chunked=True)
        + padded_get(1_000)
        + b"\r\n"
        + SMALL_GET
        + LAST_GET,
    )
    assert statuses(found) == [200, 200, 201, 200, 201, 200, 200, 200]
    # Across reads too: the second head, within the limit, arrives in two parts.
    found = answers(
        port, SMALL_GET + padded_get(40_000, end=False), b"p" * 20_000 + b"\r\n\r\n" + LAST_GET
    )
    assert statuses(found) == [200, 200, 200]


def test_past_the_pipelined_requests_a_connection_may_hold_the_next_is_503(web: Any) -> None:
    port, _ = web
    found = answers(port, SMALL_GET * (MAX_PIPELINED_REQUESTS + 20) + LAST_GET)
    # The first is answered while MAX_PIPELINED_REQUESTS wait; the next is refused, then the
    # connection closes.
    assert statuses(found) == [200] * (MAX_PIPELINED_REQUESTS + 1) + [503]
    assert json.loads(found[-1][1])["error"]["code"] == "unavailable"
    assert found[-1][2]["retry-after"] == "1"  # as every 503 (docs/decisions/0086)
    # The positive control: as many as may wait are all answered.
    found = answers(port, SMALL_GET * MAX_PIPELINED_REQUESTS + LAST_GET)
    assert statuses(found) == [200] * (MAX_PIPELINED_REQUESTS + 1)
