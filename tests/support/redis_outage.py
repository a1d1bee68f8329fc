"""Redis away, for one block of a test: the shared cache (the configuration epoch, the throttle's
counters) is pointed at a port of the test's own that refuses every connection, as a Redis that
is down refuses them. Nothing of txhub's is replaced: its own client meets the refusal."""

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.test.utils import override_settings

from apps.broker import config_cache


def epoch_once_redis_is_asked_again() -> str:
    """The configuration epoch, once this process asks Redis for it again: after a failed read it
    does not ask for OUTAGE_PAUSE, and current() answers None meanwhile (config_cache.py)."""
    deadline = time.monotonic() + config_cache.OUTAGE_PAUSE + 1.0  # a busy machine's margin
    while (epoch := config_cache.current()) is None:
        assert time.monotonic() < deadline, "the configuration cache did not read Redis again"
        time.sleep(0.05)
    return epoch


@contextmanager
def shared_cache_unreachable() -> Iterator[None]:
    """The "default" cache on a port held bound and never listened on for the block: nothing
    else can take it meanwhile, and every connect to it is refused at once. The outage ends with
    the block: the pause it left in this process is waited out, so it cannot answer for the next
    test's reads."""
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
    epoch_once_redis_is_asked_again()
