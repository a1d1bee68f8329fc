"""Redis behind Sentinels (docs/decisions/0043), through redis-py's own Sentinel support.

With TXHUB_REDIS_SENTINELS set, nothing here decides who the master is: every client asks the
Sentinels, and redis-py asks them again when a connection to the old master fails. Without it,
the plain Redis URL of CELERY_BROKER_URL is used as before.
"""

from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
from django.conf import settings
from redis.sentinel import Sentinel, SentinelConnectionPool

from txhub.connections import sentinel_addresses


class CachePool(SentinelConnectionPool):
    """A pool for Django's RedisCache, which makes its pools with
    `pool_class.from_url(LOCATION, **OPTIONS)`: LOCATION's path names the database, and the
    options `sentinels` and `service_name` the Sentinels and the master they watch."""

    @classmethod
    def from_url(  # type: ignore[override]
        cls, url: str, *, sentinels: list[tuple[str, int]], service_name: str, **options: Any
    ) -> "CachePool":
        timeout = options.get("socket_timeout")
        manager = Sentinel(sentinels, socket_timeout=timeout, socket_connect_timeout=timeout)  # type: ignore[no-untyped-call]
        database = int(urlsplit(url).path.strip("/") or 0)
        return cls(service_name, manager, db=database, **options)


def _sentinels() -> list[tuple[str, int]]:
    return sentinel_addresses(settings.TXHUB_REDIS_SENTINELS)


def broker_client(**options: Any) -> redis.Redis:
    """A client of Celery's Redis (publish, ping): its current master."""
    if not settings.TXHUB_REDIS_SENTINELS:
        return redis.Redis.from_url(settings.CELERY_BROKER_URL, **options)
    timeout = options.get("socket_timeout")
    sentinel = Sentinel(_sentinels(), socket_timeout=timeout, socket_connect_timeout=timeout)  # type: ignore[no-untyped-call]
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        settings.TXHUB_REDIS_SENTINEL_MASTER, db=0, **options
    )
    return client


def broker_async_client() -> redis.asyncio.Redis:
    """The same, for asyncio code (the gRPC processes' check-request subscriptions)."""
    if not settings.TXHUB_REDIS_SENTINELS:
        return redis.asyncio.Redis.from_url(settings.CELERY_BROKER_URL)
    sentinel = redis.asyncio.sentinel.Sentinel(_sentinels(), socket_timeout=2)  # type: ignore[no-untyped-call]
    client: redis.asyncio.Redis = sentinel.master_for(settings.TXHUB_REDIS_SENTINEL_MASTER, db=0)
    return client
