"""The process's clients of the shared cache (Redis, the "default" cache): throttle counters
(api/throttling.py) and the configuration epoch (config_cache.py)."""

from typing import Any

from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.base import BaseCache
from django.core.cache.backends.redis import RedisCache

_caches: dict[tuple[str, str], BaseCache] = {}


def cache_of(alias: str) -> BaseCache:
    """One cache client per process and alias (thread-safe: redis-py pools its connections).
    Django's `caches[...]` is per context, and under ASGI every request runs in a context of its
    own: it would connect to Redis anew for each request (a fifth of a send's web CPU, measured)."""
    key = (alias, str(settings.CACHES[alias].get("LOCATION")))
    cache = _caches.get(key)
    if cache is None:
        cache = _caches.setdefault(key, caches.create_connection(alias))
    return cache


_redis_clients: dict[int, Any] = {}


def redis_client(cache: RedisCache) -> Any:
    """One redis-py client per cache object. Django's `get_client` builds a new `Redis` on every
    call (its ~200 response callbacks set up anew: a tenth of a request's web CPU, profiled); the
    client is thread-safe and shares the cache's connection pool."""
    client = _redis_clients.get(id(cache))
    if client is None:
        client = _redis_clients.setdefault(id(cache), cache._cache.get_client(write=True))
    return client
