"""Every request body is cut at its limit while it arrives, through a real server as `make run`
starts it (issue 24, item 2; docs/decisions/0032): a 200 MiB chunked upload without a token is
refused before its body is read, one with a token is cut at the limit, a declared-too-large one
is answered without reading it, and nothing of any of them is written to disk."""

import os
import selectors
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.conf import settings

from apps.broker.services import registry
from tests.conftest import start_gunicorn
from tests.support.ports import free_port

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024
PATH = "/api/v1/topics/orders/messages"


@pytest.fixture
def web(transactional_db: None, tmp_path: Path) -> Iterator[tuple[int, str, Path, int]]:
    registry.topic_create(name="orders", queues=1)
    registry.producer_group_create(name="shop", check_url="https://127.0.0.1:9/")
    _, raw = registry.token_create(name="t", scopes=["admin"])
    spool = tmp_path / "spool"  # the web process's TMPDIR: where a spooled body would go
    spool.mkdir()
    port = free_port()
    process = start_gunicorn(port, workers=1, extra_env={"TMPDIR": str(spool)})
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    try:
        yield port, raw, spool, int(children[0])
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])


def upload(port: int, head: bytes, total: int, chunked: bool = True) -> tuple[int, bytes]:
    """Sends `head` then up to `total` bytes of body (in 64 KiB chunks) until the server answers
    or stops reading; returns (body bytes the client got into the network, the answer)."""
    sock = socket.create_connection(("127.0.0.1", port))
    # A small send buffer: what the client "sent" is close to what the server took.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    sock.sendall(head)
    sock.setblocking(False)
    piece = b"x" * (64 * 1024)
    frame = (b"%x\r\n" % len(piece)) + piece + b"\r\n" if chunked else piece
    pending, sent, answer = b"", 0, b""
    # epoll, not select(): the test process may hold file descriptors above 1024.
    watcher = selectors.DefaultSelector()
    watcher.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
    try:
        while sent < total:
            events = watcher.select(5)
            ready = events[0][1] if events else 0
            if ready & selectors.EVENT_READ or not ready & selectors.EVENT_WRITE:
                break  # an answer, or the server stopped reading
            pending = pending or frame
            try:
                done = sock.send(pending)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += done
            pending = pending[done:]
        sock.setblocking(True)
        sock.settimeout(15)
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    finally:
        watcher.close()
        sock.close()
    return sent, answer


def request_head(token: str | None, *, length: int | None = None) -> bytes:
    lines = [f"POST {PATH} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    lines.append(
        f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    )
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_a_200_mib_chunked_upload_without_a_token_is_refused_before_it_is_read(web: Any) -> None:
    port, _, spool, worker = web
    before = rss(worker)
    sent, answer = upload(port, request_head(None), 200 * MiB)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b'"unauthenticated"' in answer
    assert sent <= 2 * MiB, f"the client got {sent / MiB:.1f} MiB into the server"
    assert rss(worker) - before <= 16 * 1024, "the web process grew by more than 16 MiB"
    assert list(spool.iterdir()) == []


@pytest.mark.parametrize("which", ["unknown", "revoked"])
def test_a_chunked_upload_with_a_token_that_is_not_valid_is_refused_before_it_is_read(
    web: Any, which: str
) -> None:
    """The gate before the body looks the token up as the door would (decision 0108): a token
    that is not one, or is revoked, makes the server read no more of the body than none."""
    port, _, spool, _ = web
    if which == "revoked":
        token, raw = registry.token_create(name="revoked", scopes=["admin"])
        registry.token_revoke(token_id=token.pk)
    else:
        raw = "txh_" + "x" * 43
    sent, answer = upload(port, request_head(raw), 200 * MiB)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b'"unauthenticated"' in answer
    assert sent <= 2 * MiB, f"the client got {sent / MiB:.1f} MiB into the server"
    assert list(spool.iterdir()) == []


def test_a_chunked_upload_with_a_token_is_cut_at_the_limit(web: Any) -> None:
    port, token, spool, _ = web
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    sent, answer = upload(port, request_head(token), 200 * MiB)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b'"payload_too_large"' in answer
    assert b"connection: close" in answer.lower()
    assert sent <= limit + 2 * MiB, f"the client got {sent / MiB:.1f} MiB into the server"
    assert list(spool.iterdir()) == []


def test_a_declared_too_large_body_is_answered_without_reading_it(web: Any) -> None:
    port, token, spool, _ = web
    sent, answer = upload(port, request_head(token, length=200 * MiB), 200 * MiB, chunked=False)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"connection: close" in answer.lower()  # the rest is never read
    assert sent <= 2 * MiB, f"the client got {sent / MiB:.1f} MiB into the server"
    assert list(spool.iterdir()) == []


def test_a_normal_chunked_body_with_a_token_is_served(web: Any) -> None:
    """The positive control: chunked bodies are not refused as such."""
    port, token, spool, _ = web

    def body() -> Iterator[bytes]:
        yield b'{"producer_group": "shop", '
        time.sleep(0.05)
        yield b'"body": "order 9527 created"}'

    answer = requests.post(
        f"http://127.0.0.1:{port}{PATH}",
        data=body(),  # a generator: requests sends it chunked
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        timeout=10,
    )
    assert answer.status_code == 201, answer.text
    assert list(spool.iterdir()) == []
