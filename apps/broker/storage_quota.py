"""The producer groups over their storage quota (docs/decisions/0085), as the storage measure
(services/storage_usage.py) last published them in the shared cache, and the one check every
send and prepare makes against them (sending.message_send_batch,
transactions.transaction_prepare_batch), whichever door it came through.

The check costs no round trip: each process keeps the published set and reads it again from
Redis at most once per REFRESH_SECONDS, so the hot path takes no lock and no counter of a group's
(eight producers of one group never queue on one row). Redis unreachable: the set last read is
kept; the key gone (no measure for a while): no group is refused.
"""

import json
import logging
import threading
import time
from typing import Any

from django.conf import settings
from django.core.cache.backends.redis import RedisCache

from apps.broker import shared_cache
from apps.broker.services.errors import QuotaExceeded

logger = logging.getLogger(__name__)

OVER_QUOTA_KEY = "txhub:storage:over-quota"
# How stale a process's copy of the set may be: part of the overshoot's bound (decision 0085).
REFRESH_SECONDS = 1.0
OUTAGE_LOG_INTERVAL = 10.0

_lock = threading.Lock()
_over: dict[str, int] = {}  # group -> the bytes it was measured to keep
_read_at = float("-inf")
_last_outage_log = float("-inf")


def _client() -> Any | None:
    cache = shared_cache.cache_of("default")
    if not isinstance(cache, RedisCache):
        return None
    return shared_cache.redis_client(cache)


def full_key() -> str:
    return shared_cache.cache_of("default").make_key(OVER_QUOTA_KEY)


def publish(over: dict[str, int], *, seconds: float) -> None:
    """Publishes the groups over their quota (group -> bytes kept) for every process, for
    `seconds`: a measure that stops running stops refusing anyone then."""
    client = _client()
    if client is not None:
        client.set(full_key(), json.dumps(over), ex=max(1, int(seconds)))


def _over_quota() -> dict[str, int]:
    global _over, _read_at, _last_outage_log
    now = time.monotonic()
    if now - _read_at < REFRESH_SECONDS:
        return _over
    # One thread of the process reads it again; the others go on with the copy there is.
    if not _lock.acquire(blocking=False):
        return _over
    try:
        _read_at = now
        try:
            client = _client()
            raw = None if client is None else client.get(full_key())
            _over = {} if raw is None else dict(json.loads(raw))
        except Exception:  # noqa: BLE001 - keep what was read last; say so now and then
            if now - _last_outage_log >= OUTAGE_LOG_INTERVAL:
                _last_outage_log = now
                logger.warning(
                    "the shared cache is unreachable: storage quotas use the last list read",
                    exc_info=True,
                )
    finally:
        _lock.release()
    return _over


def check_storage_quota(producer_group: str) -> None:
    """QuotaExceeded when the group was last measured at or over its storage quota."""
    kept = _over_quota().get(producer_group)
    if kept is not None:
        raise QuotaExceeded(
            f"Producer group {producer_group!r} keeps {kept} bytes of messages, at or over its "
            "storage quota: nothing more is stored until retention removes some.",
            producer_group=producer_group,
            stored_bytes=kept,
            quota_bytes=settings.TXHUB_PRODUCER_GROUP_STORAGE_QUOTA,
        )


def forget() -> None:
    """This process reads the set again at its next check (tests)."""
    global _read_at
    _read_at = float("-inf")
