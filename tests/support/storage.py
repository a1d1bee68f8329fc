"""The storage quota's test helpers (docs/decisions/0085): what is stored, and a measure that
publishes the groups over a test's small quota."""

import time
from collections.abc import Iterator

import pytest

from apps.broker import shared_cache, storage_quota
from apps.broker.models import CommitLogEntry, DelayedMessage, HalfMessage, RecalledMessage
from apps.broker.services import storage_usage


def stored_rows() -> tuple[int, int, int, int]:
    return (
        HalfMessage.objects.count(),
        CommitLogEntry.objects.count(),
        DelayedMessage.objects.count(),
        RecalledMessage.objects.count(),
    )


def measured() -> dict[str, int]:
    """Measures now, as the beat task does, and makes this process read the result at once."""
    over = storage_usage.storage_measure()
    storage_quota.forget()
    return over


@pytest.fixture
def no_quota_published() -> Iterator[None]:
    """No group over its quota before and after the test, in this process and in Redis."""
    shared_cache.cache_of("default").delete(storage_quota.OVER_QUOTA_KEY)
    storage_quota.forget()
    yield
    if shared_cache.cache_of("default").delete(storage_quota.OVER_QUOTA_KEY):
        # Server processes (web, gRPC) keep what they read for up to this long: later tests'
        # groups of the same names must find them sending again.
        time.sleep(storage_quota.REFRESH_SECONDS + 0.2)
    storage_quota.forget()
