"""gunicorn's worker class for txhub: uvicorn's, whose HTTP protocol sends an answer's header and
body in one write (docs/decisions/0029).

uvicorn (httptools) writes the status line and headers when the app sends `http.response.start`
and the body when it sends `http.response.body`: two `send()` calls per answer. Under uvloop
each is made while holding the GIL, and over loopback (or any local network) a send also does the
receiving side's TCP work: `py-spy record --gil` on a web worker under `make bench` put 18 % of
the worker's samples in uvicorn's `send`. Here the protocol's transport keeps what is written
until the event loop's current turn ends, then writes it at once: one send, one segment, one
wake-up of the client. An answer's two messages are sent in the same turn (nothing awaits in
between), so they go out together; a streamed body still leaves chunk by chunk, each at the end
of the turn it was written in.
"""

import asyncio
import json
import os
import re
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn_worker import UvicornWorker

# What is kept at most before it is written without waiting for the turn to end.
KEEP_AT_MOST = 64 * 1024

# Pipelined requests one connection may hold waiting behind the one being answered; the next is
# answered 503 (docs/decisions/0077).
MAX_PIPELINED_REQUESTS = 32

# Where a request's head ends: its empty line (a bare LF too, as the parser allows it).
_HEAD_END = re.compile(rb"\n\r?\n")
# The empty lines the parser skips before a request: no part of its head (decision 0077).
_LINE_ENDS = b"\r\n"
_EMPTY_LINES = re.compile(rb"[\r\n]*")


# No read being parsed (see CoalescingHttpToolsProtocol._anchor).
_NO_READ = (b"", 0, 0, False)


class _StopParsing(Exception):
    """Raised in a parser callback: the request being parsed is refused, nothing after it is
    parsed (httptools stops at a callback's exception)."""


class CoalescingTransport:
    """A transport whose writes within one turn of the loop reach the real one as one write.
    Everything else is the real transport's; closing sends what is kept first."""

    __slots__ = ("_kept", "_loop", "_size", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._kept: list[bytes] = []
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._kept:
            self._loop.call_soon(self.flush)
        self._kept.append(bytes(data))
        self._size += len(data)
        if self._size >= KEEP_AT_MOST:
            # A body written in many pieces without the loop turning: memory stays bounded,
            # and the real transport's flow control (pause_writing) sees the writes.
            self.flush()

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def flush(self) -> None:
        if not self._kept:
            return
        data = self._kept[0] if len(self._kept) == 1 else b"".join(self._kept)
        self._kept.clear()
        self._size = 0
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def get_write_buffer_size(self) -> int:
        return int(self._transport.get_write_buffer_size()) + self._size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol with coalesced writes, and bounds uvicorn does not have
    (docs/decisions/0033): a request must arrive whole, headers and body, within
    TXHUB_WEB_REQUEST_READ_SECONDS of its first byte (of the connection's start, for the first:
    a connection that never sends would be kept for ever), else the connection is closed; and its
    line and headers have at most TXHUB_WEB_MAX_HEADER_BYTES, else 431. A request that has arrived
    may then take its time (a long poll waits up to 20 s): the deadline is for reading only.
    Pipelined requests (decision 0077): each head is counted wherever its bytes arrive, at most
    MAX_PIPELINED_REQUESTS wait behind the one being answered (503 past it), and a refusal is
    sent after the answers owed to the requests before it."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        from django.conf import settings

        coalescing = CoalescingTransport(transport, self.loop)  # type: ignore[arg-type]
        super().connection_made(coalescing)  # type: ignore[arg-type]
        self._read_seconds = float(settings.TXHUB_WEB_REQUEST_READ_SECONDS)
        self._max_head = int(settings.TXHUB_WEB_MAX_HEADER_BYTES)
        # The head's bytes so far while one arrives (None: reading its body; 0: none yet); its
        # last 2 bytes, where the empty line that ends it may have begun.
        self._head_bytes: int | None = 0
        self._head_tail = b""
        # While a read is parsed: the read, an offset in it at or before where the next request
        # can begin (where the body of the one in progress begins), that body's size then, and
        # whether the offset is exact (decision 0077).
        self._anchor = _NO_READ
        self._refusal: bytes | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._arm_deadline()

    def data_received(self, data: bytes) -> None:
        # Counted before the parser sees a byte (decision 0033): a head that arrives in one read
        # is parsed whole in one call, and a URL past 65,535 bytes fails in the parser itself.
        count = self._head_bytes
        if count is not None:
            start = 0
            if not count:
                self._arm_deadline()  # a request's first bytes, or empty lines (decision 0077)
                if data[0] in _LINE_ENDS:
                    start = _EMPTY_LINES.match(data).end()  # type: ignore[union-attr]
            tail = self._head_tail
            seen = tail + data
            end = _HEAD_END.search(seen, start)
            body_at = len(data) if end is None else end.end() - len(tail)
            count += body_at - start
            self._head_bytes = count
            self._head_tail = b"" if end is not None or not count else seen[-2:]
            if count > self._max_head:
                self._refuse(431, "The request line and headers are too large.")
                return
            self._anchor = (data, body_at, 0, True)
        else:
            cycle = self.cycle
            self._anchor = (data, 0, len(cycle.body) if cycle is not None else 0, True)
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError:
            if self._refusal is None:  # else a callback stopped the parser: already refused
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
        finally:
            self._anchor = _NO_READ  # the read is not kept

    def on_message_begin(self) -> None:
        if self._head_bytes == 0:  # a request began in the read where the one before it ended
            self._count_pipelined_head()
        super().on_message_begin()
        self._arm_deadline()

    def on_headers_complete(self) -> None:
        if len(self.pipeline) >= MAX_PIPELINED_REQUESTS:
            self._refuse(503, "Too many pipelined requests on one connection.")
            raise _StopParsing
        if self._over_the_connection_limit():
            # uvicorn's own test, before it would hand the request to its plain-text 503 app
            # (no hook to replace that app in 0.54): the contract's JSON 503 instead (decision
            # 0084), and the connection closed, as uvicorn closes it.
            self.logger.warning("Exceeded concurrency limit.")
            self._refuse(503, "The server has too many connections open; try again shortly.")
            raise _StopParsing
        self._head_bytes = None
        super().on_headers_complete()

    def _over_the_connection_limit(self) -> bool:
        """uvicorn's limit_concurrency (TXHUB_WEB_MAX_CONNECTIONS) reached: connections or
        requests being answered in this process, as uvicorn counts them."""
        limit = self.limit_concurrency
        if limit is None or (self.parser.should_upgrade() and self._should_upgrade()):
            return False
        return len(self.connections) >= limit or len(self.tasks) >= limit

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_bytes, self._head_tail = 0, b""  # the next request's head
        self._disarm_deadline()

    def _count_pipelined_head(self) -> None:
        """Counts the head of a request that began in the read being parsed, behind one that
        ended in it (pipelined): from where the one before it ended, which is exact after no body
        or one of known length; after a chunked body (its framing is the parser's alone) or one
        not kept (an answered request's), from that body's start in the read, which may count
        more than the head (decision 0077)."""
        data, offset, body_before, exact = self._anchor
        cycle = self.cycle
        if exact and cycle is not None and not cycle.response_complete:
            offset += len(cycle.body) - body_before  # the body before it in this read
            exact = not any(name == b"transfer-encoding" for name, _ in self.headers)
        else:
            exact = False
        if exact:
            start = _EMPTY_LINES.match(data, offset).end()  # type: ignore[union-attr]
            end = _HEAD_END.search(data, start)
            offset = len(data) if end is None else end.end()
            count = offset - start
        else:
            count = len(data) - offset
        self._anchor = (data, offset, 0, exact)
        self._head_bytes, self._head_tail = count, data[-2:]
        if count > self._max_head:
            self._refuse(431, "The request line and headers are too large.")
            raise _StopParsing

    def send_400_response(self, msg: str) -> None:
        """A request the parser refused (uvicorn's plain-text 400): in the API's format."""
        self._refuse(400, "The request is not valid HTTP.")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_deadline()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """uvicorn's graceful stop, per connection: the waiting receives of this process end now
        with an empty answer (apps/broker/wakeups.py), so the stop does not wait out (or cut, at
        gunicorn's graceful timeout) their wait_seconds."""
        from apps.broker import wakeups

        wakeups.hub().end_waits()
        super().shutdown()

    def _arm_deadline(self) -> None:
        if self._deadline is None:  # the earliest start counts: connection, then first byte
            self._deadline = self.loop.call_later(self._read_seconds, self._too_slow)

    def _disarm_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:
            # Nothing of this request reached the application: say why, then close.
            self._refuse(408, "The request did not arrive in time.")
        else:
            # The application is reading the body: closing tells it (http.disconnect).
            self.transport.close()

    def _refuse(self, status: int, message: str) -> None:
        """The contract's JSON error, then close: no application saw the request. Nothing more
        is read; answers owed to requests before it go first, as HTTP/1.1 answers go in the
        order of the requests (decision 0077)."""
        self._disarm_deadline()
        if self._refusal is not None or self.transport.is_closing():
            return
        self._refusal = _refusal(status, message)
        owed = self.cycle  # the newest request: queued requests are answered before it
        if owed is None or owed.response_complete:
            self._send_refusal()
            return
        self.flow.pause_reading()
        answered = owed.on_response

        def then_refuse() -> None:
            answered()
            self._send_refusal()

        owed.on_response = then_refuse

    def _send_refusal(self) -> None:
        if self._refusal is not None and not self.transport.is_closing():
            self.transport.write(self._refusal)
            self.transport.close()


_REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


def _refusal(status: int, message: str) -> bytes:
    from apps.broker.api.errors import CODES, error_body, unavailable_headers

    body = json.dumps(error_body(CODES[status], message)).encode()
    # A 503 carries the API's Retry-After, as at every door (docs/decisions/0086).
    extra = unavailable_headers() if status == 503 else {}
    return b"".join(
        [
            b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status]),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            *(
                b"%s: %s\r\n" % (name.lower().encode(), value.encode())
                for name, value in extra.items()
            ),
            b"connection: close\r\n\r\n",
            body,
        ]
    )


class TxhubWorker(UvicornWorker):  # type: ignore[misc]  # uvicorn_worker has no types
    CONFIG_KWARGS = {**UvicornWorker.CONFIG_KWARGS, "http": CoalescingHttpToolsProtocol}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The limits are settings (txhub/settings.py), read here in the arbiter before the
        # worker forks, as the application itself reads them.
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")
        from django.conf import settings

        self.CONFIG_KWARGS = {
            **self.CONFIG_KWARGS,
            "limit_concurrency": settings.TXHUB_WEB_MAX_CONNECTIONS,
        }
        super().__init__(*args, **kwargs)
