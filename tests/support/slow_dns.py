"""A slow DNS for check URLs: the resolver (`callbacks.resolve`, the boundary the DNS-rebinding
tests patch) made to wait before it does the real lookup of a given address.

The system's resolver cannot be pointed at a slow DNS server of the test's own without editing
/etc/resolv.conf; the lookup is the environment's, like the producer's endpoint, and everything
after it (the deadline, the address checks, the bound on lookups left behind) is txhub's own
(docs/decisions/0083, 0087)."""

import threading
from typing import Any

import pytest

from apps.broker.services import callbacks

DEADLINE = 1.0  # s: TXHUB_CHECK_HTTP_TIMEOUT while a slow DNS is armed
LOOKUP_THREAD = "check-url-lookup"  # the name of a lookup's own thread (services/callbacks.py)
REAL_RESOLVE = callbacks.resolve


class SlowDns:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._monkeypatch = monkeypatch
        self._released = threading.Event()

    def arm(self, seconds: float, address: str = "127.0.0.1") -> None:
        """From now on every lookup waits `seconds`, then answers the real lookup of
        `address`."""
        released = self._released

        def lookup(host: str, port: int) -> list[str]:
            released.wait(seconds)
            return REAL_RESOLVE(address, port)

        self._monkeypatch.setattr(callbacks, "resolve", lookup)

    def release(self) -> None:
        """Every lookup still waiting answers now; returns once their threads have ended."""
        self._released.set()
        for thread in threading.enumerate():
            if thread.name == LOOKUP_THREAD:
                thread.join(5)


def lookup_threads() -> list[Any]:
    return [thread for thread in threading.enumerate() if thread.name == LOOKUP_THREAD]
