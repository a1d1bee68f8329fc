"""What a test runs in its process whose DNS is the slow DNS server (tests/support/slow_dns.py):
txhub's own calls of a check URL and requests of its doors, timed here, with what the test
asserts on sent back as JSON. main() is the process's entry (`manage.py shell -c`)."""

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import User
from django.db import connections, transaction
from django.test import Client
from rest_framework.test import APIClient

from apps.broker.models import HalfMessage
from apps.broker.services import callbacks, checkback
from apps.broker.services.errors import CallbackRefused
from tests.support.slow_dns import RESULT, WAITING
from tests.support.statement_faults import own_connection

LOOKUP_THREAD = "check-url-lookup"  # the name of a lookup's own thread (services/callbacks.py)


def lookup_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == LOOKUP_THREAD]


def resolving() -> bool:
    """Whether a lookup's thread is inside `callbacks.resolve` now: waiting for the resolver."""
    frames = sys._current_frames()
    for thread in lookup_threads():
        frame = frames.get(thread.ident or 0)
        while frame is not None:
            if frame.f_code.co_name == "resolve":
                return True
            frame = frame.f_back
    return False


def _fetch(half_id: int) -> HalfMessage:
    return HalfMessage.objects.select_related("producer_group", "topic").get(pk=half_id)


def _call(half_id: int) -> dict[str, Any]:
    started = time.monotonic()
    outcome = callbacks.call_check_url(_fetch(half_id))
    took = time.monotonic() - started
    return {
        "answer": outcome.answer,
        "reached": outcome.reached,
        "error": outcome.error,
        "took": took,
    }


def url_check(url: str) -> dict[str, Any]:
    """callback_url_check(url): the addresses it allowed, or the message it refused with."""
    try:
        return {"addresses": callbacks.callback_url_check(url)}
    except CallbackRefused as refused:
        return {"refused": str(refused)}


def _pause() -> None:
    """Waits for the test (Probe.resume), e.g. while it releases the DNS server's answers."""
    print(WAITING, flush=True)
    sys.stdin.readline()


def calls(half_id: int, count: int) -> dict[str, Any]:
    """`count` calls of the half's check URL, one after another."""
    outcomes = [_call(half_id) for _ in range(count)]
    return {"outcomes": outcomes, "lookup_threads": len(lookup_threads())}


def check(half_id: int, leave_behind: int = 0, pause: bool = False) -> dict[str, Any]:
    """A claimed check of the half (checkback_run), after `leave_behind` calls whose lookups were
    left behind; with `pause`, the test resumes the probe between the two and lookups still
    waiting then end (up to 5 s each) before the check."""
    left = [_call(half_id) for _ in range(leave_behind)]
    if pause:
        _pause()
        for thread in lookup_threads():
            thread.join(5)
    threads = len(lookup_threads())
    claimed = checkback.checkback_claim_due()
    started = time.monotonic()
    result = checkback.checkback_run(half_id=half_id)
    return {
        "left": left,
        "lookup_threads": threads,
        "claimed": claimed,
        "result": result,
        "took": time.monotonic() - started,
    }


def _client(token: str | None, user: str | None) -> Client:
    if user is not None:
        client = Client()
        client.force_login(User.objects.get(username=user))
        return client
    api = APIClient()
    if token is not None:
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return api


def _send(client: Client, step: dict[str, Any]) -> dict[str, Any]:
    send = getattr(client, step["method"])
    started = time.monotonic()
    if step.get("form"):
        response = send(step["path"], step["data"])
    else:
        response = send(step["path"], step["data"], format="json")
    took = time.monotonic() - started
    return {
        "status_code": response.status_code,
        "headers": {name: value for name, value in response.headers.items()},
        "content": response.content.decode(errors="replace"),
        "took": took,
    }


def requests(
    steps: list[dict[str, Any]],
    token: str | None = None,
    user: str | None = None,
    half_id: int | None = None,
    leave_behind: int = 0,
) -> dict[str, Any]:
    """Each step's request (method, path, data; `form` for a form post) and its answer, by the
    test client of the token or of the signed-in `user`, after `leave_behind` calls of the half's
    check URL whose lookups were left behind."""
    left = [_call(half_id) for _ in range(leave_behind)] if half_id is not None else []
    client = _client(token, user)
    return {"left": left, "answers": [_send(client, step) for step in steps]}


def _watched(client: Client, step: dict[str, Any], in_transaction: bool) -> dict[str, Any]:
    """The step's answer, and what was inside a transaction while a check URL's lookup was
    under way, seen from a thread and a session of the probe's own: the state of each session in
    one ("idle in transaction"...), and "atomic" when the requesting thread's connection was in
    an atomic block (psycopg sends its BEGIN only with the first statement, so a block is a
    transaction at the database as soon as anything in it queries). `in_transaction`: the step
    is sent inside a transaction of the probe's own that has queried, the positive control of
    what the watcher sees. The watcher's exception is raised here: a watcher that died would
    have seen nothing (decision 0116)."""
    requesting = connections["default"]  # this thread's: the test client's view runs here
    seen: set[str] = set()
    looked_up = threading.Event()
    done = threading.Event()
    failures: list[BaseException] = []

    def watch() -> None:
        try:
            _watch()
        except BaseException as error:  # noqa: BLE001 - raised by the requesting thread below
            failures.append(error)

    def _watch() -> None:
        with own_connection(autocommit=True) as watcher:
            while not done.is_set():
                # What was seen counts only if the lookup was in the resolver before and after
                # the look: a lookup's thread outlives the moment it hands its answer over, and
                # the request's own write may already have begun then.
                if resolving():
                    looked_up.set()
                    atomic = requesting.in_atomic_block
                    rows = watcher.execute(
                        "SELECT state FROM pg_stat_activity WHERE datname = current_database() "
                        "AND xact_start IS NOT NULL AND pid <> pg_backend_pid()"
                    ).fetchall()
                    if resolving():
                        seen.update(["atomic"] if atomic else [])
                        seen.update(str(state) for (state,) in rows)
                time.sleep(0.01)

    watching = threading.Thread(target=watch)
    watching.start()
    try:
        if in_transaction:
            with transaction.atomic():
                User.objects.exists()  # the block's BEGIN goes out now
                answer = _send(client, step)
        else:
            answer = _send(client, step)
    finally:
        done.set()
        watching.join()
    if failures:
        raise failures[0]
    return {**answer, "seen": sorted(seen), "looked_up": looked_up.is_set()}


def watched_requests(
    steps: list[dict[str, Any]], token: str, in_transaction: bool = False
) -> list[dict[str, Any]]:
    """Each step's answer, with what was in a transaction during its lookup (_watched)."""
    client = _client(token, None)
    return [_watched(client, step, in_transaction) for step in steps]


PROBES: dict[str, Callable[..., Any]] = {
    "calls": calls,
    "url_check": url_check,
    "check": check,
    "requests": requests,
    "watched_requests": watched_requests,
}


def main() -> None:
    asked = json.loads(os.environ["TXHUB_SLOW_DNS_PROBE"])
    answer = PROBES[asked["probe"]](**asked["args"])
    print(RESULT + json.dumps(answer), flush=True)
    os._exit(0)  # lookups left behind may still be waiting: they end with the process
