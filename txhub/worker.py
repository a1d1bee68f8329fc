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
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        coalescing = CoalescingTransport(transport, self.loop)  # type: ignore[arg-type]
        super().connection_made(coalescing)  # type: ignore[arg-type]


class TxhubWorker(UvicornWorker):  # type: ignore[misc]  # uvicorn_worker has no types
    CONFIG_KWARGS = {**UvicornWorker.CONFIG_KWARGS, "http": CoalescingHttpToolsProtocol}
