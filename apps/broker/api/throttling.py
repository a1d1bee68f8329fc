"""Per-token rate limits (CONTRACT section 6): TXHUB_THROTTLE_RATE, counted in the shared cache.

The budget of a token is one counter per fixed window in Redis (Django's RedisCache, the
"default" cache), so every web process of a deployment draws from the same budget
(docs/decisions/0011). DRF's own SimpleRateThrottle keeps a list of timestamps read and written
back with get + set: two processes can both read the old list and both let a request through, and
at 2000/s the list is 2000 floats pickled per request. An atomic INCR per request has neither
problem; the price is the fixed window's known edge (up to twice the rate across a boundary).
"""

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, cast

from django.conf import settings
from django.core.cache.backends.base import BaseCache
from django.core.cache.backends.redis import RedisCache
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from apps.broker import config_cache, shared_cache

logger = logging.getLogger(__name__)

# A cache outage is logged at most this often per process: at 2000 requests/s a line per request
# would bury everything else in the log.
OUTAGE_LOG_INTERVAL = 10.0
_last_outage_log = 0.0


def _throttle_cache() -> BaseCache:
    return shared_cache.cache_of(settings.TXHUB_THROTTLE_CACHE)


# A request attribute: this request's count, made with the configuration epoch's read.
COUNTED = "_txhub_counted"


@dataclass(frozen=True)
class Counted:
    token_id: int
    count: int
    now: float


class TokenRateThrottle(SimpleRateThrottle):
    """TXHUB_THROTTLE_RATE requests per window for each API token (keyed by the token's id).

    Throttles run once in DRF's `initial()`, so a long-poll receive counts once however long it
    waits. Requests without a token are not counted here (they get 401 first)."""

    scope = "token"
    num_requests: int | None  # set by SimpleRateThrottle.__init__ from the rate
    duration: int | None
    now: float
    cache_format = "txhub:throttle:%(scope)s:%(ident)s:%(window)d"

    def get_rate(self) -> str | None:
        return settings.TXHUB_THROTTLE_RATE or None

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if request.auth is None:
            return None
        return self._key(cast(int, request.auth))  # BearerTokenAuthentication: the id

    def _key(self, token_id: int) -> str:
        window = int(self.now // (self.duration or 1))
        return self.cache_format % {"scope": self.scope, "ident": token_id, "window": window}

    def allow_request(self, request: Request, view: Any) -> bool:
        if request.auth is None:
            return True
        return self.allow_token(cast(int, request.auth), getattr(request, COUNTED, None))

    def count_in(self, pipeline: Any, token_id: int) -> bool:
        """Adds this request's count for the token to `pipeline` (a redis-py pipeline of the
        throttle's own cache): INCR then EXPIRE, as `_count` does. False when there is nothing
        to count (rate limiting off, or a cache that is not Redis)."""
        if self.rate is None or self.num_requests is None or self.duration is None:
            return False
        if not isinstance(_throttle_cache(), RedisCache):
            return False
        self.now = self.timer()
        full_key = _throttle_cache().make_key(self._key(token_id))
        pipeline.incr(full_key)
        pipeline.expire(full_key, int(self.duration) + 5)
        return True

    def allow_token(self, token_id: int, counted: Counted | None = None) -> bool:
        """Counts one call of the token (unless `counted` did, in the auth's round trip to
        Redis: epoch_and_count); False once its window's budget is spent."""
        if self.rate is None or self.num_requests is None or self.duration is None:
            return True
        if counted is not None and counted.token_id == token_id:
            self.now = counted.now
            return counted.count <= self.num_requests
        self.now = self.timer()
        try:
            count = self._count(self._key(token_id))
        except Exception:  # noqa: BLE001 - any cache failure: fail open, see _log_outage
            _log_outage()
            return True
        return bool(count <= self.num_requests)

    def _count(self, key: str) -> int:
        """This request's number in its window, atomically across every process."""
        cache = _throttle_cache()
        # The key outlives its window by a margin: it is gone soon after, never before.
        timeout = int(self.duration or 1) + 5
        if isinstance(cache, RedisCache):
            # One round trip (INCR creates the key at 1, EXPIRE bounds it) through the cache's
            # own connection pool. Django's portable incr below costs two or three (EXISTS,
            # INCRBY, and `add` for a new window).
            # make_key: ours are short ASCII; Django's validation scans every key for memcached.
            full_key = cache.make_key(key)
            pipeline = shared_cache.redis_client(cache).pipeline(transaction=False)
            pipeline.incr(full_key)
            pipeline.expire(full_key, timeout)
            count, _ = pipeline.execute()
            return int(count)
        try:
            return int(cache.incr(key))
        except ValueError:  # the window's first request (or its first after an expiry)
            if cache.add(key, 1, timeout=timeout):
                return 1
            return int(cache.incr(key))  # another process created it in between

    def wait(self) -> float:
        """Whole seconds until the window ends, at least 1 (Retry-After)."""
        duration = self.duration or 1
        remaining = duration - (self.now % duration)
        return float(max(1, math.ceil(remaining)))


def token_call_throttled(token_id: int, counted: Counted | None = None) -> float | None:
    """Counts one call of the token against TXHUB_THROTTLE_RATE (unless `counted` did), for a
    door that is not DRF (the gRPC door): None within the budget, else the whole seconds until
    the window ends. The same counter as the REST API's, so a token has one budget whichever
    door it calls."""
    throttle = TokenRateThrottle()
    return None if throttle.allow_token(token_id, counted) else throttle.wait()


def epoch_and_count(known_token_id: int | None) -> tuple[str | None, Counted | None]:
    """The configuration epoch (config_cache.current) and, for a token this process knows
    already, this call's count in the same Redis round trip: one round trip per call instead of
    two, at every door. The count is made for the id the token had when kept (the id of a token
    never changes); a call that turns out unauthenticated is counted but not throttled."""
    if known_token_id is None or settings.TXHUB_THROTTLE_CACHE != "default":
        return config_cache.current(), None
    throttle = TokenRateThrottle()
    counting: list[bool] = []
    epoch, results = config_cache.current_with(
        lambda pipeline: counting.append(throttle.count_in(pipeline, known_token_id))
    )
    if results and counting and counting[0]:
        return epoch, Counted(known_token_id, int(results[0]), throttle.now)
    return epoch, None


def _log_outage() -> None:
    global _last_outage_log
    now = time.monotonic()
    if now - _last_outage_log >= OUTAGE_LOG_INTERVAL:
        _last_outage_log = now
        logger.warning(
            "rate limiting is off: the throttle cache is unreachable; requests pass unthrottled",
            exc_info=True,
        )
