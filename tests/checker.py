"""The producer's side of a check-back, for tests: a real HTTP server on 127.0.0.1 that answers
with a decision chosen per transaction, verifies signatures with its own code (not txhub's), and
records every request (any method: a followed redirect arrives as a GET)."""

import base64
import hashlib
import hmac
import json
import sys
import threading
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = tuple[int, bytes] | tuple[int, bytes, dict[str, str]]


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(
        sig.startswith("v1,") and hmac.compare_digest(sig[3:], expected)
        for sig in headers["webhook-signature"].split(" ")
    )


class Checker:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        # Given the check's JSON body, returns (status, response body bytes) or (status, body,
        # extra response headers), e.g. a redirect's Location.
        self.decide: Callable[[dict[str, Any]], Answer] = lambda body: (
            200,
            b'{"state": "UNKNOWN"}',
        )
        checker = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(raw) if raw else {}
                checker.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "body": body,
                        "raw": raw,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                    }
                )
                status, answer, *extra = checker.decide(body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for name, value in (extra[0] if extra else {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST  # noqa: N815 - the http.server API

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                """An exception in a request thread (a broken `decide`, a bad body) is kept and
                fails the test at close(), not printed and lost: otherwise it would look like an
                unreachable producer. A caller that hung up (txhub's deadline) is not an error."""
                error = sys.exc_info()[1]
                if not isinstance(error, ConnectionError):
                    checker.errors.append("".join(traceback.format_exception(error)))

        self.errors: list[str] = []
        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/check"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, state: str) -> None:
        self.decide = lambda body: (200, json.dumps({"state": state}).encode())

    def checks_of(self, transaction_id: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["body"].get("transaction_id") == transaction_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self.errors:
            raise AssertionError(
                f"the fake producer's request threads raised {len(self.errors)} time(s):\n"
                + self.errors[0]
            )
