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
import os
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn_worker import UvicornWorker

# What is kept at most before it is written without waiting for the turn to end.
KEEP_AT_MOST = 64 * 1024


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
    may then take its time (a long poll waits up to 20 s): the deadline is for reading only."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        from django.conf import settings

        coalescing = CoalescingTransport(transport, self.loop)  # type: ignore[arg-type]
        super().connection_made(coalescing)  # type: ignore[arg-type]
        self._read_seconds = float(settings.TXHUB_WEB_REQUEST_READ_SECONDS)
        self._max_head = int(settings.TXHUB_WEB_MAX_HEADER_BYTES)
        self._head_bytes: int | None = None  # counting while a request's head arrives
        self._deadline: asyncio.TimerHandle | None = None
        self._arm_deadline()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_bytes is not None:
            self._head_bytes += len(data)
            if self._head_bytes > self._max_head and not self.transport.is_closing():
                self._refuse(b"431 Request Header Fields Too Large")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._arm_deadline()

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm_deadline()

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
            self._refuse(b"408 Request Timeout")
        else:
            # The application is reading the body: closing tells it (http.disconnect).
            self.transport.close()

    def _refuse(self, status: bytes) -> None:
        self._disarm_deadline()
        self.transport.write(
            b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        )
        self.transport.close()


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
