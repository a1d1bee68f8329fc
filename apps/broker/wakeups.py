"""Wake-ups for waiting consumers, one hub per ASGI web process (docs/decisions/0024).

A message becomes receivable in one place (sending.take_offsets: send, commit, delayed
delivery) plus a dead letter sent back (dead_letters.dlq_resend); both NOTIFY `txhub_receivable` in
their transaction, so Postgres delivers the notification when, and only if, it commits, to every
process that listens: wake-ups cross processes.

Each web process keeps one LISTEN connection of its own (outside the pool; started with the
first waiting receive, reconnected with a back-off after any failure). A notification for a topic
wakes, per consumer group waiting on that topic in this process, as many waiters as it takes to
receive the messages announced (each takes up to its max_messages: a batch of 64 wakes two
receives of 32), the oldest first; the others keep waiting (no thundering herd of 500 receives
per message, nor 64 per batch).

Nothing is lost for good when a notification is: every TXHUB_LONG_POLL_FALLBACK seconds, and just
after (re)connecting, the hub asks Postgres once, on the same connection and for all its waiters,
which (topic, group) pairs have something receivable (a queue beyond the group's cursor, or an
in-flight message whose invisible time ran out: an expiry is the passage of time, which nobody
could NOTIFY) and wakes that many waiters; expired messages only waiters whose tag filter takes
them (decision 0081). An idle process with no waiter asks nothing.

Known empty (docs/decisions/0026): a consumer that long-polls an empty topic asks again each time
its wait ends; 500 of them at `wait_seconds` 5 are 100 receives a second that would each ask
Postgres what it just answered. When a try found nothing receivable, the hub remembers it for the
(topic, group, tag filter), with the topic's wake-up count and the connection's generation read
before the try. A later receive that would wait skips its first try while the count and
generation are unchanged (no NOTIFY for the topic since, no gap in listening) and the note is
younger than twice the fallback period; it waits at once, exactly as a woken-and-unlucky waiter
would. The fallback check renews the notes of the filters it found nothing for. What no NOTIFY
announces (an invisible time running out) reaches such a receive by the fallback check, as it
reaches every waiter.

Revocation (docs/decisions/0034): revoking a token NOTIFYs the same channel, "revoked <token id>",
delivered when the revocation commits. Each process's hub ends what the token holds open there:
its waiting receives (`wait` raises Revoked; the doors answer as to an unauthenticated call) and
whatever else registered with `watch_token` (the gRPC door's Telemetry streams). Deleting a
consumer group NOTIFYs "group-deleted <group id>": its waiters try again at once and are told it
is gone (decision 0088). A notification missed while the hub did not listen, or a revocation
scheduled for later, is caught by the fallback check, which also asks which watched tokens are
revoked by now and which waiting groups are gone.

Everything here runs on the event loop's thread, except `seen()`, `mark()`, `known_empty()` and
`note_empty()`, which the receive view calls from a worker thread (single dict reads and writes:
atomic under the GIL).
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

import psycopg
from django.conf import settings
from psycopg import pq
from psycopg.conninfo import make_conninfo

from apps.broker.fallback_reads import RECEIVABLE_SQL, REVOKED_SQL
from apps.broker.services.sending import RECEIVABLE_CHANNEL
from apps.broker.tag_wakeups import Tags, takes_any, to_wake

logger = logging.getLogger(__name__)

# How the LISTEN connection shows in pg_stat_activity: "<the pool's application_name>-wakeups"
# when DATABASE_URL sets one (?application_name=...), else this.
APPLICATION_NAME = "txhub-wakeups"

# The payload of a revocation on RECEIVABLE_CHANNEL (services/registry.token_revoke), and of a
# consumer group's deletion (registry.consumer_group_delete, decision 0088).
REVOKED = "revoked"
GROUP_DELETED = "group-deleted"


class Revoked(Exception):
    """The token of a waiting receive was revoked while it waited."""


class Waiter:
    """One waiting receive. Its event is set when it should try again; `wants` is how many
    messages one try of it takes at most (its max_messages); `tags`, its tag filter."""

    __slots__ = ("event", "group_id", "revoked", "tags", "topic_id", "wants")

    def __init__(self, topic_id: int, group_id: int, wants: int = 1, tags: Tags = None) -> None:
        self.topic_id = topic_id
        self.group_id = group_id
        self.wants = max(1, wants)
        self.tags = tags
        self.event = asyncio.Event()
        self.revoked = False


class Mark(NamedTuple):
    """What the hub knew before a try: the topic's wake-up count, whether it listened, and the
    generation of its connection (a new one after every gap in listening)."""

    seen: int
    listening: bool
    generation: int


class Hub:
    def __init__(self) -> None:
        # topic -> group -> waiters, oldest first (a dict keeps insertion order).
        self._waiting: dict[int, dict[int, dict[Waiter, None]]] = {}
        self._seen: dict[int, int] = {}
        # (topic, group, tag filter) -> (seen, generation, monotonic time it expires): found
        # empty then, for a receive with that filter (decision 0081).
        self._empty: dict[tuple[int, int, Tags], tuple[int, int, float]] = {}
        # token id -> what to call when it is revoked (waiting receives, Telemetry streams).
        self._holders: dict[int, dict[Callable[[], None], None]] = {}
        self._task: asyncio.Task[None] | None = None
        self.listening = False
        self.generation = 0
        self.checks = 0  # fallback checks done (tests and the bench read it through logs)
        # The server is stopping: waits end now with what they have (nothing), so a graceful
        # stop answers its waiting consumers instead of cutting them at the grace period.
        self.closing = False

    # --- waiters (event loop) ------------------------------------------------------------------

    def seen(self, topic_id: int) -> int:
        """How many wake-ups for the topic this process has seen (read from any thread)."""
        return self._seen.get(topic_id, 0)

    def mark(self, topic_id: int) -> Mark:
        """Read before a try whose emptiness may be noted (`note_empty`). The generation is read
        first: a gap sets `listening` False before it moves the generation on, so a mark never
        pairs "listening" from before a gap with the generation after it."""
        generation = self.generation
        return Mark(self.seen(topic_id), self.listening, generation)

    def note_empty(self, topic_id: int, group_id: int, mark: Mark, tags: Tags = None) -> None:
        """A try that started at `mark` found nothing receivable for the group (and filter)."""
        if mark.listening and mark.generation == self.generation:
            until = time.monotonic() + 2 * _fallback()
            self._empty[(topic_id, group_id, tags)] = (mark.seen, mark.generation, until)

    def known_empty(self, topic_id: int, group_id: int, tags: Tags = None) -> bool:
        """Nothing receivable, as far as this process can tell without asking Postgres: a try
        found nothing, and since then no wake-up for the topic and no gap in listening."""
        note = self._empty.get((topic_id, group_id, tags))
        return (
            note is not None
            and self.listening
            and note[1] == self.generation
            and note[0] == self.seen(topic_id)
            and time.monotonic() < note[2]
        )

    def register(self, topic_id: int, group_id: int, wants: int = 1, tags: Tags = None) -> Waiter:
        self._start()
        waiter = Waiter(topic_id, group_id, wants, tags)
        self._waiting.setdefault(topic_id, {}).setdefault(group_id, {})[waiter] = None
        return waiter

    def unregister(self, waiter: Waiter) -> None:
        groups = self._waiting.get(waiter.topic_id, {})
        waiters = groups.get(waiter.group_id, {})
        waiters.pop(waiter, None)
        if not waiters:
            groups.pop(waiter.group_id, None)
        if not groups:
            self._waiting.pop(waiter.topic_id, None)

    def requeue(self, waiter: Waiter) -> None:
        """Back to the end of its line after a try that found nothing."""
        waiters = self._waiting.get(waiter.topic_id, {}).get(waiter.group_id)
        if waiters is not None and waiter in waiters:
            del waiters[waiter]
            waiters[waiter] = None

    def wake(self, topic_id: int, count: int, group_id: int | None = None) -> None:
        """Wakes, in each group (or in one group) waiting on the topic, the oldest waiters until
        together they take `count` messages: a batch of 64 wakes two receives of 32, not 64
        receives of which 62 would find nothing."""
        self._seen[topic_id] = self._seen.get(topic_id, 0) + 1
        for group, waiters in self._waiting.get(topic_id, {}).items():
            if group_id is not None and group != group_id:
                continue
            left = count
            for waiter in waiters:
                if left <= 0:
                    break
                if not waiter.event.is_set():
                    waiter.event.set()
                    left -= waiter.wants

    def wake_tagged(self, topic_id: int, group_id: int, counts: dict[str, int]) -> None:
        """Expired messages of the group, counted per tag: wakes the oldest waiters whose tag
        filter takes them, as many as it takes to receive them (tag_wakeups.py, decision 0081)."""
        self._seen[topic_id] = self._seen.get(topic_id, 0) + 1
        waiters = self._waiting.get(topic_id, {}).get(group_id, {})
        for waiter in to_wake((w for w in waiters if not w.event.is_set()), counts):
            waiter.event.set()

    def wake_group(self, group_id: int) -> None:
        """The group was deleted: each of its waiters tries again now, and is told (0088)."""
        for key in [key for key in list(self._empty) if key[1] == group_id]:
            self._empty.pop(key, None)
        for groups in self._waiting.values():
            for waiter in groups.get(group_id, {}):
                waiter.event.set()

    def watch_token(self, token_id: int, on_revoked: Callable[[], None]) -> None:
        """Calls `on_revoked` (on the loop) once the token is revoked; starts listening."""
        self._start()
        self._holders.setdefault(token_id, {})[on_revoked] = None

    def unwatch_token(self, token_id: int, on_revoked: Callable[[], None]) -> None:
        holders = self._holders.get(token_id, {})
        holders.pop(on_revoked, None)
        if not holders:
            self._holders.pop(token_id, None)

    def revoked(self, token_id: int) -> None:
        for on_revoked in list(self._holders.pop(token_id, {})):
            try:
                on_revoked()
            except Exception:  # noqa: BLE001 - one holder's failure must not spare the others
                logger.exception("ending the work of revoked token %s", token_id)

    def end_waits(self) -> None:
        """The process is stopping: every wait, and every one that starts from now on, ends at
        once with nothing found (its client gets the answer of a wait that ran out)."""
        self.closing = True
        self.wake_all()

    def wake_all(self) -> None:
        """Every waiter tries again (the hub stops, or cannot listen)."""
        for groups in self._waiting.values():
            for waiters in groups.values():
                for waiter in waiters:
                    waiter.event.set()

    # --- the LISTEN connection ------------------------------------------------------------------

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._listen_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.wake_all()

    async def _listen_forever(self) -> None:
        delay = 0.2
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    _conninfo(), autocommit=True
                ) as conn:
                    await conn.execute(f"LISTEN {RECEIVABLE_CHANNEL}")
                    # A new generation once listening again, too: a mark taken during the gap
                    # cannot note anything under it.
                    self.generation += 1
                    self.listening, delay = True, 0.2
                    # Notifications read while a query runs on the connection (LISTEN, the
                    # check) reach psycopg's handlers; those read while it idles, the reader.
                    conn.add_notify_handler(lambda note: self._on_notify(note.payload))
                    while True:
                        # What was announced while nobody listened, then every fallback period.
                        await self._check(conn)
                        await _read_notifies(conn, self._on_notify, _fallback())
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - any failure: reconnect, never die
                logger.warning("long-poll wake-ups: %s; reconnecting in %.1f s", error, delay)
            finally:
                # Notifications may be missed from here on: nothing noted empty stays so.
                was_listening, self.listening = self.listening, False
                self.generation += 1
                self._empty.clear()
                if was_listening:
                    # Waiters poll on their own (long_poll.py) until the hub listens again.
                    self.wake_all()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _on_notify(self, payload: str) -> None:
        # "topic queue offset", or "topic queue first_offset count" for a batch appended at once.
        fields = payload.split(" ")
        if fields[0] == REVOKED and len(fields) == 2 and fields[1].isdigit():
            self.revoked(int(fields[1]))
        elif fields[0] == GROUP_DELETED and len(fields) == 2 and fields[1].isdigit():
            self.wake_group(int(fields[1]))
        elif fields[0].isdigit():
            count = int(fields[3]) if len(fields) > 3 and fields[3].isdigit() else 1
            self.wake(int(fields[0]), count)

    async def _check(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if self._holders:
            cursor = await conn.execute(REVOKED_SQL, (list(self._holders),))
            for (token_id,) in await cursor.fetchall():
                self.revoked(int(token_id))
        # Notes are per tag filter, which clients choose: those past their time go (0081).
        now = time.monotonic()
        for key in [key for key, note in list(self._empty.items()) if note[2] <= now]:
            self._empty.pop(key, None)
        filters = {
            (topic_id, group_id): {waiter.tags for waiter in waiters}
            for topic_id, groups in self._waiting.items()
            for group_id, waiters in groups.items()
        }
        if not filters:
            return
        self.checks += 1
        marks = {topic_id: self.mark(topic_id) for topic_id, _ in filters}
        pairs = list(filters)
        tagged = [any(tags is not None for tags in filters[pair]) for pair in pairs]
        cursor = await conn.execute(
            RECEIVABLE_SQL, ([p[0] for p in pairs], [p[1] for p in pairs], tagged)
        )
        found: dict[tuple[int, int], set[str | None]] = {}
        expired: dict[tuple[int, int], dict[str, int]] = {}
        for topic_id, group_id, tag, count in await cursor.fetchall():
            pair = (int(topic_id), int(group_id))
            found.setdefault(pair, set()).add(tag)
            if tag is None:
                self.wake(pair[0], int(count), group_id=pair[1])
            else:
                expired.setdefault(pair, {})[tag] = int(count)
        for (topic_id, group_id), counts in expired.items():
            self.wake_tagged(topic_id, group_id, counts)
        # Renewed: the notes of each filter waiting on a pair that nothing found takes.
        for (topic_id, group_id), pair_filters in filters.items():
            for tags in pair_filters:
                if not takes_any(tags, found.get((topic_id, group_id), set())):
                    self.note_empty(topic_id, group_id, marks[topic_id], tags)


async def _read_notifies(
    conn: psycopg.AsyncConnection[Any], on_notify: Callable[[str], None], seconds: float
) -> None:
    """Hands each notification that arrives on the idle connection to `on_notify`, for
    `seconds`; raises if the connection fails. The socket is watched by the event loop and read
    when it is readable, every notification waiting then handled at once: psycopg's
    `notifies()` generator sets up and tears down a wait (a reader, a future, a timeout) per
    read, which profiled at ~5 % of a web process's CPU when every commit notifies."""
    loop = asyncio.get_running_loop()
    pgconn = conn.pgconn
    encoding = conn.info.encoding
    socket = pgconn.socket  # read once: asking a lost connection for it raises
    failed: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            pgconn.consume_input()  # libpq's socket is non-blocking: reads what is there
            while (note := pgconn.notifies()) is not None:
                on_notify(note.extra.decode(encoding))
            if pgconn.status != pq.ConnStatus.OK:
                raise psycopg.OperationalError("the LISTEN connection is closed")
        except Exception as error:  # noqa: BLE001 - handed to the caller, which reconnects
            loop.remove_reader(socket)
            if not failed.done():
                failed.set_exception(error)

    loop.add_reader(socket, readable)
    try:
        readable()  # what arrived between the last query and now
        await asyncio.wait_for(asyncio.shield(failed), seconds)  # raises what failed
    except TimeoutError:
        pass
    finally:
        loop.remove_reader(socket)


def _conninfo() -> str:
    db = settings.DATABASES["default"]
    options = db.get("OPTIONS") or {}
    pooled_name = options.get("application_name")
    # The libpq parameters among the pool's options (target_session_attrs with several hosts:
    # LISTEN on the primary, where the NOTIFYs are sent; keepalives; sslmode; decision 0042).
    libpq = {key: value for key, value in options.items() if key in _LIBPQ_KEYWORDS}
    return make_conninfo(
        **{"connect_timeout": 5, **libpq},
        dbname=db["NAME"],
        user=db.get("USER") or None,
        password=db.get("PASSWORD") or None,
        host=db.get("HOST") or None,
        port=str(db.get("PORT") or "") or None,
        application_name=f"{pooled_name}-wakeups" if pooled_name else APPLICATION_NAME,
    )


_LIBPQ_KEYWORDS = frozenset(option.keyword.decode() for option in pq.Conninfo.get_defaults())
_LIBPQ_KEYWORDS -= {"dbname", "user", "password", "host", "port", "application_name"}

T = TypeVar("T")


async def wait(
    *,
    topic_id: int,
    group_id: int,
    seen: int,
    deadline: float,
    attempt: Callable[[], Awaitable[T]],
    found: Callable[[T], bool],
    wants: int = 1,
    tags: Tags = None,
    token_id: int | None = None,
) -> T | None:
    """A waiting receive of either door (REST long poll, gRPC ReceiveMessage): until `deadline`
    (loop time), wait on this process's hub and, each time it is woken, `attempt` again (a short
    sync section that gives its connection back); the first result that `found` accepts is
    returned, None when the time is up. `seen` is `hub().seen(topic_id)` read before the first
    attempt: a wake-up between that attempt and now is not missed. Holds no thread and no
    database connection while it waits. Raises Revoked when `token_id` is revoked meanwhile.
    `tags`, the receive's tag filter: only what it takes wakes it (decision 0081)."""
    loop = asyncio.get_running_loop()
    the_hub = hub()
    waiter = the_hub.register(topic_id, group_id, wants, tags)

    def on_revoked() -> None:
        waiter.revoked = True
        waiter.event.set()

    if token_id is not None:
        the_hub.watch_token(token_id, on_revoked)
    try:
        if the_hub.seen(topic_id) != seen:
            waiter.event.set()
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0 or the_hub.closing:
                return None
            # While the hub cannot listen (Postgres away, reconnecting), poll at the fallback
            # period on our own: a hub that never comes back must not turn waits into misses.
            timeout = remaining if the_hub.listening else min(remaining, _fallback())
            try:
                await asyncio.wait_for(waiter.event.wait(), timeout)
            except TimeoutError:
                if the_hub.listening or loop.time() >= deadline:
                    continue
            waiter.event.clear()
            if waiter.revoked:
                raise Revoked(f"Token {token_id} was revoked while its receive waited.")
            if the_hub.closing:
                return None
            result = await attempt()
            if found(result):
                return result
            the_hub.requeue(waiter)
    finally:
        the_hub.unregister(waiter)
        if token_id is not None:
            the_hub.unwatch_token(token_id, on_revoked)


def _fallback() -> float:
    return float(settings.TXHUB_LONG_POLL_FALLBACK)


_hub: Hub | None = None


def hub() -> Hub:
    """This process's hub (made on first use; its connection starts with the first waiter)."""
    global _hub
    if _hub is None:
        _hub = Hub()
    return _hub
