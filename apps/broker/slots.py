"""How many long-lived slots one token holds at once in this process (docs/decisions/0084).

A waiting receive (a REST long poll, whichever door took it, and a gRPC ReceiveMessage's wait:
apps/broker/waiting.py) and an open gRPC Telemetry stream (grpc/streams.py) each hold a slot of
their process for up to their wait or the connection's age. The process's own bounds (uvicorn's
TXHUB_WEB_MAX_CONNECTIONS, grpcio's TXHUB_GRPC_MAX_CONCURRENT_RPCS) are shared by every tenant,
so each token may hold at most TXHUB_MAX_WAITS_PER_TOKEN waits and TXHUB_GRPC_MAX_STREAMS_PER_TOKEN
streams: past that, `held` refuses (services.errors.Throttled: 429 `throttled`, gRPC
TOO_MANY_REQUESTS) before the wait or the stream begins, so nothing is stored or held.

Counted in this process only, as what they hold is: nothing shared is asked per call. A wait
runs on the event loop and a WSGI wait in a thread, so the count is taken under a lock.
"""

import threading
from collections import Counter
from enum import Enum
from types import TracebackType

from django.conf import settings

from apps.broker.services.errors import Throttled


class Kind(Enum):
    WAIT = "waiting receives"
    STREAM = "Telemetry streams"


_CAP_SETTINGS = {
    Kind.WAIT: "TXHUB_MAX_WAITS_PER_TOKEN",
    Kind.STREAM: "TXHUB_GRPC_MAX_STREAMS_PER_TOKEN",
}
# A refused client waits this long before it tries again: a slot is given back when a wait ends
# (at most the long poll's 20 s) or a stream closes, so a short retry finds one soon enough.
RETRY_AFTER_SECONDS = 1

_lock = threading.Lock()
_held: Counter[tuple[Kind, int]] = Counter()


class Slot:
    """A slot taken; given back once, when its `with` block ends (or `release()`)."""

    def __init__(self, key: tuple[Kind, int] | None) -> None:
        self._key = key

    def release(self) -> None:
        key, self._key = self._key, None
        if key is None:
            return
        with _lock:
            _held[key] -= 1
            if _held[key] <= 0:
                del _held[key]

    def __enter__(self) -> "Slot":
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.release()


def held(token_id: int | None, kind: Kind) -> Slot:
    """A slot of `kind` for the token, taken now (use it in a `with`); Throttled when the token
    holds its cap of them already. No token (a plan made without one, as internal callers may):
    nothing counted."""
    if token_id is None:
        return Slot(None)
    cap = int(getattr(settings, _CAP_SETTINGS[kind]))
    key = (kind, token_id)
    with _lock:
        if _held[key] >= cap:
            raise Throttled(
                f"This token holds {cap} {kind.value} in this server process already "
                f"({_CAP_SETTINGS[kind]}); try again when one has ended.",
                retry_after=RETRY_AFTER_SECONDS,
            )
        _held[key] += 1
    return Slot(key)


def holding(token_id: int, kind: Kind) -> int:
    """How many slots of `kind` the token holds in this process now."""
    with _lock:
        return _held[(kind, token_id)]
