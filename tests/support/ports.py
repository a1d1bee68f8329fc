"""Ports for the processes the tests start.

A port is picked below the kernel's ephemeral range (`ip_local_port_range`), never from it: a
test picks a port, closes it, and its server binds it seconds later (a Patroni replica only after
its base backup). A port from the ephemeral range can be taken in between as the source port of
any outgoing connection (the suite's workers hold hundreds), and the server then cannot bind it
for as long as that connection lives. Below the range, only another listener can take it.
"""

import random
import socket
from pathlib import Path

# What `make run` and `make run-ha` listen on (scripts/services.sh, scripts/ha.sh): a test never
# takes them, so a developer's running txhub and a test run side by side.
RESERVED = frozenset(
    {54329, 63799, 8000, 8081, 54331, 54332, 54333, 8008, 8009, 8010, 23790, 23800}
    | {63811, 63812, 26381, 26382, 26383}
)
# The lowest port picked: above the well-known and most registered services' ports.
LOWEST = 20000
_RANDOM = random.SystemRandom()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports (Linux's default if unread)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(count: int, taken: frozenset[int] | set[int] = frozenset()) -> list[int]:
    """`count` distinct ports on 127.0.0.1 that nothing listens on now, none RESERVED or in
    `taken`, all below the ephemeral range: held bound together while they are picked."""
    low, _ = ephemeral_range()
    candidates = [p for p in range(LOWEST, low) if p not in RESERVED and p not in taken]
    _RANDOM.shuffle(candidates)  # not the global generator: seeded tests keep their sequences
    sockets: list[socket.socket] = []
    try:
        for port in candidates:
            if len(sockets) == count:
                break
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
        if len(sockets) < count:
            raise RuntimeError(f"fewer than {count} free ports in {LOWEST}..{low - 1}")
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, never a RESERVED one, below the
    ephemeral range."""
    return free_ports(1)[0]
