"""Redis away, for one block of a test: the shared cache (the configuration epoch, the throttle's
counters) is pointed at a port of the test's own that refuses every connection, as a Redis that
is down refuses them. Nothing of txhub's is replaced: its own client meets the refusal."""

import socket
from collections.abc import Iterator
from contextlib import contextmanager

from django.test.utils import override_settings


@contextmanager
def shared_cache_unreachable() -> Iterator[None]:
    """The "default" cache on a port held bound and never listened on for the block: nothing
    else can take it meanwhile, and every connect to it is refused at once."""
    closed = socket.socket()
    try:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        caches = {
            "default": {
                "BACKEND": "django.core.cache.backends.redis.RedisCache",
                "LOCATION": f"redis://127.0.0.1:{port}/0",
                "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
            }
        }
        with override_settings(CACHES=caches):
            yield
    finally:
        closed.close()
