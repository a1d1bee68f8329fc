"""Fixtures of the broker's in-process tests."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.slow_dns import SlowDns, require_namespaces


@pytest.fixture
def slow_dns(transactional_db: None, tmp_path: Path) -> Iterator[SlowDns]:
    """The test's own DNS server (tests/support/slow_dns.py), whose probes run txhub's code in a
    process that asks it every lookup; TXHUB_CHECK_HTTP_TIMEOUT there is DEADLINE."""
    require_namespaces()
    dns = SlowDns(tmp_path)
    yield dns
    dns.close()
