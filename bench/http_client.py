"""A light keep-alive JSON client for the benchmarks: the load generator shares the machine's two
cores with the server (pgbench's client, the ceiling's, is C), so it should spend as little CPU
as it can.

HTTP/1.1 over one socket, written by hand: http.client parses every response's headers with the
email package, which cost the load generator ~0.44 ms of CPU per message (prepare + commit),
taken from the server's cores. This reads only what it needs: the status, Content-Length and
Connection; anything it does not understand (no Content-Length, an unexpected close) is an error,
never a guess. A kept-alive connection that the server closed while it idled is replaced and
the request sent again (the server closed it before reading anything of it).
"""

import json
import socket
from typing import Any
from urllib.parse import urlsplit


class Client:
    def __init__(self, base: str, token: str, headers: dict[str, str] | None = None) -> None:
        """`headers`: sent with every request too (e.g. what a TLS proxy in front adds)."""
        parts = urlsplit(base)
        self.prefix = parts.path.rstrip("/") or "/api/v1"
        self.address = (parts.hostname or "127.0.0.1", parts.port or 80)
        host = f"{self.address[0]}:{self.address[1]}"
        extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        self.head = (
            f"Host: {host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nAccept: application/json\r\n{extra}"
        ).encode()
        self.sock: socket.socket | None = None
        self.buffer = b""

    def post(self, path: str, payload: object = None) -> dict[str, Any]:
        body = json.dumps(payload or {}).encode()
        request = b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s" % (
            (self.prefix + path).encode(),
            self.head,
            len(body),
            body,
        )
        status, answer = self._exchange(request)
        if status >= 300:
            raise RuntimeError(f"{path}: {status} {answer[:200]!r}")
        return dict(json.loads(answer))

    def _exchange(self, request: bytes) -> tuple[int, bytes]:
        reused = self.sock is not None
        if self.sock is None:
            self.sock = socket.create_connection(self.address)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.buffer = b""
        try:
            self.sock.sendall(request)
            self._fill()
        except ConnectionError:  # BrokenPipeError and ConnectionResetError among them
            if not reused:
                raise
            # No answer at all on a kept-alive connection: the server closed it while it idled
            # (gunicorn's keep-alive is 2 s), before our request; sent again on a new one.
            self.close()
            return self._exchange(request)
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length: int | None = None
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        if length is None:
            raise RuntimeError(f"an answer without Content-Length: {head[:200]!r}")
        while len(self.buffer) < length:
            self._fill()
        answer, self.buffer = self.buffer[:length], self.buffer[length:]
        if close:
            self.close()
        return status, answer

    def _fill(self) -> None:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        if not chunk:
            self.close()
            raise ConnectionError("the server closed the connection mid-answer")
        self.buffer += chunk

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None
        self.buffer = b""
