"""/readyz's probe of Postgres and Redis, at most once per PERIOD_SECONDS per process whatever the
number of callers, in a thread of its own, each step bounded (docs/decisions/0086).

/readyz is open to anyone. A probe per request made every anonymous request a Postgres round
trip and a new Redis connection, which a flood could turn into an outage of the rate limits and
of every tenant (Redis's maxclients). Here:

- A reading is served as it is for PERIOD_SECONDS. Past that, the first caller starts a probe in
  a daemon thread, and callers keep the last reading until the probe ends, for at most a step's
  bound (TIMEOUT_SECONDS + GRACE_SECONDS) more. A reading older than that (no caller for a
  while) is waited for, for at most what is left of the probe's step.
- One probe at a time per process, so a hung dependency holds one thread of its own, never a
  request's: a step that has not ended past its bound is reported as "error: Timeout".
- Postgres: a connection from the process's pool, waited for at most TIMEOUT_SECONDS, and its
  socket shut if SELECT 1 has no answer by then (a server that accepts and never answers).
- Redis: one client per process, kept (one connection, not one per probe), with connect and
  reply timeouts of TIMEOUT_SECONDS and no retry; a connection found dead is replaced on the
  next probe.
"""

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from django.db import connection
from redis.backoff import NoBackoff
from redis.retry import Retry

from txhub.redis_sentinel import broker_client

# How long a reading is served as it is; the bound of each step of a probe; how long past its
# bound a step that has not ended is called hanging (a step ends at its bound by itself: the
# pool's wait, the socket's timeouts; decision 0086).
PERIOD_SECONDS = 1.0
TIMEOUT_SECONDS = 2.0
GRACE_SECONDS = 0.5

PARTS = ("postgres", "redis")
HANGING = "error: Timeout"
NOT_ASKED = "unknown"  # a part the probe did not reach while an earlier step hangs

Checks = dict[str, str]


@dataclass
class Reading:
    checks: Checks
    at: float  # time.monotonic() when its probe ended


@dataclass
class Probe:
    """A probe in flight: the parts asked so far, and the step it is in since when."""

    checks: Checks = field(default_factory=dict)
    step: str = PARTS[0]
    step_started: float = field(default_factory=time.monotonic)

    def hanging(self) -> Checks:
        """What is known while its step hangs: not ready."""
        known = {part: self.checks.get(part, NOT_ASKED) for part in PARTS}
        return {**known, self.step: HANGING}


def ready(checks: Checks) -> bool:
    return all(value == "ok" for value in checks.values())


class Readiness:
    def __init__(self, period: float = PERIOD_SECONDS, timeout: float = TIMEOUT_SECONDS) -> None:
        self.period = period
        self.timeout = timeout
        self.bound = timeout + GRACE_SECONDS  # past it, a step that has not ended hangs
        self.changed = threading.Condition()
        self.reading: Reading | None = None
        self.probe: Probe | None = None
        self.redis: redis.Redis | None = None  # created by the probe thread, kept

    def current(self) -> Checks:
        """The parts' states, as recent as the rules above allow."""
        with self.changed:
            now = time.monotonic()
            reading = self.reading
            if reading is not None and now - reading.at < self.period:
                return reading.checks
            probe = self.probe or self._start()
            if reading is not None and now - reading.at < self.period + self.bound:
                return reading.checks
            while self.probe is probe or self.reading is None:
                left = probe.step_started + self.bound - time.monotonic()
                if left <= 0:
                    return probe.hanging()
                self.changed.wait(left)
            return self.reading.checks  # the probe's, or a newer one

    def _start(self) -> Probe:
        self.probe = Probe()
        threading.Thread(
            target=self._run, args=(self.probe,), name="txhub-readiness", daemon=True
        ).start()
        return self.probe

    def _run(self, probe: Probe) -> None:
        steps: dict[str, Callable[[], None]] = {
            "postgres": self._ask_postgres,
            "redis": self._ask_redis,
        }
        try:
            for part in PARTS:
                with self.changed:
                    probe.step, probe.step_started = part, time.monotonic()
                probe.checks[part] = _outcome(steps[part])
        finally:
            with self.changed:
                checks = {part: probe.checks.get(part, NOT_ASKED) for part in PARTS}
                self.reading = Reading(checks, time.monotonic())
                self.probe = None
                self.changed.notify_all()

    def _ask_postgres(self) -> None:
        pool: Any = getattr(connection, "pool", None)  # PostgreSQL's wrapper has one
        if pool is None:  # TXHUB_DB_POOL=0: this thread's own connection, closed after
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 1")
            finally:
                connection.close()
            return
        started = time.monotonic()
        pool.open()  # as Django's first checkout does, if no request has yet
        with pool.connection(timeout=self.timeout) as raw:
            left = self.timeout - (time.monotonic() - started)
            with _shut_unless_answered(raw.pgconn.socket, max(left, 0.01)):
                raw.execute("SELECT 1")

    def _ask_redis(self) -> None:
        if self.redis is None:
            self.redis = broker_client(
                socket_timeout=self.timeout,
                socket_connect_timeout=self.timeout,
                retry=Retry(NoBackoff(), 0),
            )
        self.redis.ping()


def _outcome(step: Callable[[], None]) -> str:
    try:
        step()
    except Exception as error:  # noqa: BLE001 - any failure means "not ready"
        return f"error: {error.__class__.__name__}"
    return "ok"


@contextlib.contextmanager
def _shut_unless_answered(fileno: int, seconds: float) -> Iterator[None]:
    """The socket shut down if the block has not ended within `seconds`: a query waiting on it
    fails at once (its connection broken, which the pool then discards) instead of waiting for
    a server that took it and answers nothing (decision 0086)."""
    lock = threading.Lock()
    ended = False

    def shut() -> None:
        with lock:
            if ended:
                return
            with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fileno)) as sock:
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(seconds, shut)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with lock:
            ended = True
        timer.cancel()


READINESS = Readiness()
