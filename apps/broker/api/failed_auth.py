"""Failed authentications cost nothing after the first few (docs/decisions/0038).

Per process, in memory (no Redis, no Postgres: that is the point):
- token hashes found unknown or revoked are remembered for TXHUB_BAD_TOKEN_SECONDS (at most
  TXHUB_BAD_TOKEN_MEMORY of them, the oldest forgotten first): the same junk token again is
  refused at once. A token's hash cannot be sent before the token exists (it is random), and a
  revocation is final, so remembering a bad hash never refuses a good token.
- failed authentications are counted per client address over a minute: past
  TXHUB_AUTH_FAILURES_PER_MINUTE, a request from that address with a token this process does not
  already know as good is answered 429 before any lookup. Known-good tokens from the same address
  (a NAT shared with a flooder) are served as before.
"""

import threading
import time
from collections import OrderedDict, deque

from django.conf import settings

_lock = threading.Lock()
_bad: "OrderedDict[str, float]" = OrderedDict()  # token hash -> until (monotonic)
_failures: dict[str, deque[float]] = {}  # client address -> times of its recent failures


def known_bad(hashed: str) -> bool:
    now = time.monotonic()
    with _lock:
        until = _bad.get(hashed)
        if until is None:
            return False
        if until < now:
            del _bad[hashed]
            return False
        return True


def over_budget(address: str) -> float | None:
    """Seconds to wait when the address has used up its failures for the minute, else None."""
    budget = int(settings.TXHUB_AUTH_FAILURES_PER_MINUTE)
    if budget <= 0 or not address:
        return None
    now = time.monotonic()
    with _lock:
        times = _failures.get(address)
        if times is None:
            return None
        while times and times[0] < now - 60:
            times.popleft()
        if len(times) < budget:
            return None
        return max(1.0, 60 - (now - times[0]))


def failed(hashed: str, address: str) -> None:
    """A token was unknown or revoked: remember its hash and count the failure."""
    now = time.monotonic()
    with _lock:
        _bad[hashed] = now + float(settings.TXHUB_BAD_TOKEN_SECONDS)
        _bad.move_to_end(hashed)
        while len(_bad) > int(settings.TXHUB_BAD_TOKEN_MEMORY):
            _bad.popitem(last=False)
        if address:
            times = _failures.setdefault(address, deque())
            times.append(now)
            while len(times) > int(settings.TXHUB_AUTH_FAILURES_PER_MINUTE) + 1:
                times.popleft()
            if len(_failures) > int(settings.TXHUB_BAD_TOKEN_MEMORY):
                _failures.pop(next(iter(_failures)))  # the address counted longest ago


def forget() -> None:
    """Everything remembered (tests start each case from nothing, as config_cache.forget)."""
    with _lock:
        _bad.clear()
        _failures.clear()
