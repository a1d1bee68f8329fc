"""The per-token rate limit's budget in the shared cache."""

import time

from django.conf import settings
from django.core.cache import caches

from apps.broker.api.throttling import TokenRateThrottle


def fresh_budget(token_id: int, duration: int) -> None:
    """The test database is new each run, so token ids repeat: a rerun within the window would
    find the previous run's count in Redis under the same id."""
    now = time.time()
    for window in (int(now // duration), int(now // duration) + 1):
        key = TokenRateThrottle.cache_format % {
            "scope": TokenRateThrottle.scope,
            "ident": token_id,
            "window": window,
        }
        caches[settings.TXHUB_THROTTLE_CACHE].delete(key)
