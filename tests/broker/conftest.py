"""Fixtures of the broker's in-process tests."""

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.slow_dns import DEADLINE, SlowDns


@pytest.fixture
def slow_dns(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """slow_dns(seconds, address): with TXHUB_CHECK_HTTP_TIMEOUT at DEADLINE, from now on every
    check URL lookup waits `seconds`, then answers the real lookup of `address` (127.0.0.1 by
    default). Lookups still waiting end with the test, before the next one starts."""
    settings.TXHUB_CHECK_HTTP_TIMEOUT = DEADLINE
    dns = SlowDns(monkeypatch)
    yield dns.arm
    dns.release()
