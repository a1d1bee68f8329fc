"""txhub/worker.py's CoalescingTransport over a real TCP connection on the event loop: what is
written within one turn of the loop leaves in one write when the turn ends; a large write leaves
at once; closing sends what was kept first. The peer is a plain socket read without blocking,
so whether bytes have left is seen, not guessed."""

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from tests.support.tcp import data_segments_in
from txhub.worker import KEEP_AT_MOST, CoalescingTransport


def arrived(peer: socket.socket) -> bytes:
    try:
        return peer.recv(1 << 22, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return b""


def run(check: Callable[[CoalescingTransport, socket.socket], Awaitable[None]]) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        listener = socket.create_server(("127.0.0.1", 0))
        peer = socket.create_connection(listener.getsockname())
        ours, _ = listener.accept()
        listener.close()
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
        try:
            await check(CoalescingTransport(transport, loop), peer)
        finally:
            transport.close()
            peer.close()

    asyncio.run(main())


def test_writes_of_one_turn_leave_together() -> None:
    async def check(coalescing: CoalescingTransport, peer: socket.socket) -> None:
        before = data_segments_in(peer)
        coalescing.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        coalescing.write(b"{}")
        assert arrived(peer) == b"", "nothing leaves before the turn ends"
        await asyncio.sleep(0.05)
        assert arrived(peer) == b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
        assert data_segments_in(peer) - before == 1

        coalescing.write(b"next")  # a later turn: its own write
        await asyncio.sleep(0.05)
        assert arrived(peer) == b"next"
        assert data_segments_in(peer) - before == 2

    run(check)


def test_a_large_body_is_not_kept() -> None:
    async def check(coalescing: CoalescingTransport, peer: socket.socket) -> None:
        piece = b"x" * (KEEP_AT_MOST // 4)
        for _ in range(4):
            coalescing.write(piece)
        got = arrived(peer)
        # Without the loop turning: all of it has been handed to the socket (what the peer's
        # buffer has not taken yet waits in the real transport, not in ours).
        assert coalescing.get_write_buffer_size() == coalescing._transport.get_write_buffer_size()
        await asyncio.sleep(0.05)
        while len(got) < 4 * len(piece):
            more = arrived(peer)
            assert more, "the rest of the body never came"
            got += more
        assert got == piece * 4

    run(check)


def test_close_sends_what_was_kept() -> None:
    async def check(coalescing: CoalescingTransport, peer: socket.socket) -> None:
        coalescing.write(b"last words")
        coalescing.close()
        assert arrived(peer) == b"last words", "sent by close(), before the turn ends"
        await asyncio.sleep(0.05)  # the real transport closes the socket on the next turn
        peer.settimeout(5)
        assert peer.recv(100) == b"", "then the connection is closed"

    run(check)


def test_everything_else_is_the_real_transports() -> None:
    async def check(coalescing: CoalescingTransport, peer: socket.socket) -> None:
        real: Any = coalescing._transport
        assert coalescing.get_extra_info("peername") == real.get_extra_info("peername")
        assert coalescing.is_closing() is False
        coalescing.pause_reading()
        assert real.is_reading() is False
        coalescing.resume_reading()
        assert real.is_reading() is True

    run(check)
