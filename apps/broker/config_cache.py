"""What every API request reads and almost never changes, kept per process and checked against a
shared epoch (docs/decisions/0026): API tokens, producer and consumer groups, topics, topic
bindings.

The epoch is a random value in Redis. Every change of a cached thing calls `changed()` after its
write: the epoch gets a new value at once and again when the transaction commits. A request reads
the epoch once, before anything else (api/auth.py), and uses an entry only if it was loaded under
that same epoch. So once `DELETE /tokens/{id}` has answered, every later request of every process
loads the token anew: it "revokes at once" (CONTRACT). The value set at once covers a change that
is rolled back (what was loaded since is what stays); the one set on commit makes stale anything
loaded between the write and its commit.

Entries expire after TXHUB_CONFIG_CACHE_SECONDS whatever the epoch says: the bound on a change the
epoch never heard of (an UPDATE typed into psql, a change made while Redis was away). Redis
unreachable: nothing is cached, every read goes to Postgres. TXHUB_CONFIG_CACHE_SECONDS=0: off.
"""

import logging
import secrets
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from django.conf import settings
from django.core.cache.backends.redis import RedisCache
from django.db import connection, transaction

from apps.broker import shared_cache
from apps.broker.services.errors import Unavailable

logger = logging.getLogger(__name__)

EPOCH_KEY = "txhub:config-epoch"
# A bound on memory: names that exist (unknown ones are never kept), cleared whole when reached.
MAX_ENTRIES = 10_000
# A Redis outage is logged at most this often per process (every request would otherwise log).
OUTAGE_LOG_INTERVAL = 10.0
_last_outage_log = 0.0
# After a failed read, Redis is not asked again for this long: each try can cost the cache's
# socket timeout, and the throttle already pays one per request while Redis is away.
OUTAGE_PAUSE = 1.0
_paused_until = 0.0

T = TypeVar("T")

# key -> (epoch it was loaded under, monotonic time it expires, value). Values are immutable or
# copied by the caller: threads of the process share them.
_entries: dict[Hashable, tuple[str, float, Any]] = {}


def _client() -> Any | None:
    cache = shared_cache.cache_of("default")
    if not isinstance(cache, RedisCache):
        return None
    return shared_cache.redis_client(cache)


_keys: dict[int, str] = {}


def _key() -> str:
    """The epoch's key in the cache's namespace, made once per cache (Django's validation of a
    key scans it for memcached's sake: 3 % of a request's web CPU, profiled)."""
    cache = shared_cache.cache_of("default")
    key = _keys.get(id(cache))
    if key is None:
        key = _keys.setdefault(id(cache), cache.make_and_validate_key(EPOCH_KEY))
    return key


def current() -> str | None:
    """The epoch now (one Redis round trip), or None: do not cache (off, or Redis away)."""
    global _paused_until
    if settings.TXHUB_CONFIG_CACHE_SECONDS <= 0 or time.monotonic() < _paused_until:
        return None
    try:
        client = _client()
        if client is None:
            return None
        value = client.get(_key())
        if value is None:  # a new Redis (or one restarted empty): a new epoch
            new = secrets.token_hex(8)
            value = new if client.set(_key(), new, nx=True) else client.get(_key())
    except Exception:  # noqa: BLE001 - any cache failure: read from Postgres, see _log_outage
        _paused_until = time.monotonic() + OUTAGE_PAUSE
        # A change made while this process could not see the epoch must not be hidden by what
        # it kept from before, once the old epoch reads again.
        _entries.clear()
        _log_outage("configuration is read from Postgres on every request")
        return None
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def current_with(commands: Callable[[Any], None]) -> tuple[str | None, list[Any] | None]:
    """The epoch and, in the same round trip, the Redis commands `commands` adds to the pipeline
    it is given (the throttle's count: api/auth.py). Returns (epoch, their results); results None
    when they did not run (caching off or paused, or Redis away: the caller does without)."""
    global _paused_until
    if settings.TXHUB_CONFIG_CACHE_SECONDS <= 0 or time.monotonic() < _paused_until:
        return None, None
    try:
        client = _client()
        if client is None:
            return None, None
        pipeline = client.pipeline(transaction=False)
        pipeline.get(_key())
        commands(pipeline)
        value, *results = pipeline.execute()
    except Exception:  # noqa: BLE001 - as current()
        _paused_until = time.monotonic() + OUTAGE_PAUSE
        _entries.clear()
        _log_outage("configuration is read from Postgres on every request")
        return None, None
    if value is None:  # a new Redis: current() makes the epoch
        return current(), results
    return (value.decode() if isinstance(value, bytes) else str(value)), results


def peek(key: Hashable) -> Any | None:
    """What this process keeps under `key`, whatever its epoch (not to be used as is: a hint of
    what a request will be, to batch its first round trip)."""
    entry = _entries.get(key)
    return None if entry is None else entry[2]


def read(epoch: str | None, key: Hashable, load: Callable[[], T | None]) -> T | None:
    """`load()`'s value, kept for later requests under the same epoch. `epoch` must have been
    read (`current()`) before this: what `load` sees is then at least as new as the epoch. None
    (nothing found) is never kept, so an unknown name costs a query each time, as before."""
    if epoch is None:
        return load()
    now = time.monotonic()
    entry = _entries.get(key)
    if entry is not None and entry[0] == epoch and now < entry[1]:
        value: T = entry[2]
        return value
    found = load()
    if found is not None:
        if len(_entries) >= MAX_ENTRIES:
            _entries.clear()
        _entries[key] = (epoch, now + settings.TXHUB_CONFIG_CACHE_SECONDS, found)
    return found


def changed(*, strict: bool = True) -> None:
    """Call after writing a token, group, topic or binding, inside the writing transaction: a new
    epoch now, and another when the transaction commits (at once again when there is none).

    `strict`: when the new epoch cannot be set, raise Unavailable (503), which rolls the change
    back: a change that answered 2xx holds at once on every process. Not strict: for a row just
    created, which nobody can have kept."""
    if not _new_epoch() and strict:
        raise Unavailable(
            "The shared cache (Redis) is unreachable: this change could not be made known to "
            "every web process, so it was not made. Try again."
        )
    if connection.in_atomic_block:
        transaction.on_commit(_new_epoch)


def _new_epoch() -> bool:
    """A new epoch; False if it could not be set (logged)."""
    try:
        client = _client()
        if client is not None:
            client.set(_key(), secrets.token_hex(8))
        return True
    except Exception:  # noqa: BLE001 - the caller decides; say what it means
        logger.error(
            "the configuration epoch could not be set: web processes may use what they cached "
            "before for up to %s s if the change stands",
            settings.TXHUB_CONFIG_CACHE_SECONDS,
            exc_info=True,
        )
        return False


def forget() -> None:
    """Drops this process's entries (tests)."""
    _entries.clear()


def _log_outage(consequence: str) -> None:
    global _last_outage_log
    now = time.monotonic()
    if now - _last_outage_log >= OUTAGE_LOG_INTERVAL:
        _last_outage_log = now
        logger.warning("the shared cache is unreachable: %s", consequence, exc_info=True)


def _on_write(created: bool = False, **_: Any) -> None:
    changed(strict=not created)


def watch_models() -> None:
    """Every ORM save or delete of a cached model, and every change of a group's topics, calls
    `changed()` (BrokerConfig.ready). Writes that bypass signals (`QuerySet.update`) call it
    themselves (services/registry.py)."""
    from django.db.models.signals import m2m_changed, post_delete, post_save

    from apps.broker.models import ApiToken, ConsumerGroup, ProducerGroup, Topic

    for model in (ApiToken, ConsumerGroup, ProducerGroup, Topic):
        post_save.connect(_on_write, sender=model, dispatch_uid=f"config-{model.__name__}-save")
        post_delete.connect(_on_write, sender=model, dispatch_uid=f"config-{model.__name__}-del")
    for through in (ProducerGroup.topics.through, ConsumerGroup.topics.through):
        m2m_changed.connect(_on_write, sender=through, dispatch_uid=f"config-{through.__name__}")
