"""Ports for the processes the tests start."""

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
