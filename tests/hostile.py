"""Hostile producers' check URLs, for tests: real little HTTP servers on 127.0.0.1 that drip an
answer a byte at a time, stream 50 MB, or pad a valid decision with 50 MB of blanks. Each counts
the requests it got and the bytes it managed to send."""

import contextlib
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FIFTY_MB = 50 * 1024 * 1024


class HostileEndpoint:
    """kind: "drip-body" (headers at once, then a byte every `interval` s), "drip-headers" (the
    status line and headers themselves a byte at a time), "huge" (50 MB of JSON-ish bytes),
    "padded-commit" (50 MB of spaces, then {"state": "COMMIT"})."""

    def __init__(self, kind: str, interval: float = 0.2) -> None:
        self.kind = kind
        self.interval = interval
        self.requests = 0
        self.sent = 0
        self.stopped = threading.Event()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                endpoint.requests += 1
                with contextlib.suppress(OSError):  # txhub hung up on us: that is the point
                    endpoint.answer(self)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                """An exception in a request thread (a broken answer, an unknown kind) is kept
                and fails the test at close(), not printed and lost: txhub would see a producer
                that hung up, which is what most of these tests expect (decision 0116)."""
                error = sys.exc_info()[1]
                if not isinstance(error, ConnectionError):  # txhub hung up: the point
                    endpoint.errors.append("".join(traceback.format_exception(error)))

        self.errors: list[str] = []
        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/check"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _write(self, handler: BaseHTTPRequestHandler, data: bytes) -> None:
        handler.wfile.write(data)
        handler.wfile.flush()
        self.sent += len(data)

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        commit = b'{"state": "COMMIT"}'
        if self.kind == "drip-headers":
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"X-Slow: a\r\n" * 200
            for byte in head:
                if self.stopped.wait(self.interval):
                    return
                self._write(handler, bytes([byte]))
            return
        if self.kind == "drip-body":
            body = b" " * 1000 + commit
            self._head(handler, len(body))
            for byte in body:
                if self.stopped.wait(self.interval):
                    return
                self._write(handler, bytes([byte]))
            return
        if self.kind == "huge":
            block = b'{"pad": "' + b"x" * (64 * 1024 - 11) + b'"}'
            self._head(handler, FIFTY_MB)
            while self.sent < FIFTY_MB and not self.stopped.is_set():
                self._write(handler, block[: FIFTY_MB - self.sent])
            return
        if self.kind == "padded-commit":
            self._head(handler, FIFTY_MB + len(commit))
            block = b" " * (64 * 1024)
            while self.sent < FIFTY_MB and not self.stopped.is_set():
                self._write(handler, block[: FIFTY_MB - self.sent])
            self._write(handler, commit)
            return
        raise AssertionError(f"unknown kind {self.kind}")

    def _head(self, handler: BaseHTTPRequestHandler, length: int) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(length))
        handler.end_headers()
        handler.wfile.flush()

    def close(self) -> None:
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()
        if self.errors:
            raise AssertionError(
                f"the hostile endpoint's request threads raised {len(self.errors)} time(s):\n"
                + self.errors[0]
            )
