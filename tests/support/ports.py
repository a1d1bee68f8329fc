"""Ports for the processes the tests start."""

import socket

# What `make run` and `make run-ha` listen on (scripts/services.sh, scripts/ha.sh): a test never
# takes them, so a developer's running txhub and a test run side by side.
RESERVED = frozenset(
    {54329, 63799, 8000, 8081, 54331, 54332, 54333, 8008, 8009, 8010, 23790, 23800}
    | {63811, 63812, 26381, 26382, 26383}
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS's pick), never a RESERVED one."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in RESERVED:
            return port
