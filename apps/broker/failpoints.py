"""Failpoints: named sites where a test can make txhub crash or stall exactly inside a window
(after the half message is durable but before the producer hears so, say).

Armed by the environment, read once at import:

    TXHUB_FAILPOINTS="after_half_insert=exit;after_commit_before_answer=25%sleep(2)"

An action is `exit` (the process ends at once, like kill -9: no response, no cleanup),
`sleep(S)`, or `raise` (an exception, the request fails with a 500); an optional `P%` prefix
fires it on that share of hits. Unset, every site is `if ARMED:` on a module constant that is
False: nothing else runs on the hot path (docs/decisions/0015).

A test arms a site in its own process with `armed_here(site, step)`: each hit runs the test's
step there (another connection's commit inside the window, racers held until all came), through
the same sites and the same `ARMED` test (docs/decisions/0098).
"""

import os
import random
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

SITES = frozenset(
    {
        "after_half_insert",
        "after_msg_id_check",
        "after_send_before_answer",
        "after_commit_before_answer",
        "after_ack_before_answer",
        "after_check_answer_before_write",
        "after_check_read_before_lock",
        "before_check_send",
        "during_check_call",
        "after_fifo_heads_read",
        "after_idempotency_key_read",
        "after_delayed_due_read",
    }
)
_ACTION = re.compile(
    r"(?:(?P<percent>\d{1,3}(?:\.\d+)?)%)?(?P<kind>exit|raise|sleep\((?P<s>[\d.]+)\))"
)


class FailpointError(RuntimeError):
    """Raised by a `raise` failpoint."""


@dataclass(frozen=True)
class Action:
    kind: str  # exit | raise | sleep
    probability: float
    seconds: float = 0.0


def parse(spec: str) -> dict[str, Action]:
    armed: dict[str, Action] = {}
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        name, _, action = item.partition("=")
        match = _ACTION.fullmatch(action.strip())
        if name.strip() not in SITES or match is None:
            raise ValueError(f"TXHUB_FAILPOINTS: cannot arm {item!r} (sites: {sorted(SITES)})")
        kind = match["kind"].split("(")[0]
        percent = float(match["percent"]) if match["percent"] else 100.0
        armed[name.strip()] = Action(kind, percent / 100, float(match["s"] or 0))
    return armed


_ARMED = parse(os.environ.get("TXHUB_FAILPOINTS", ""))
# Steps armed in this process by `armed_here`, by site.
_STEPS: dict[str, Callable[[], None]] = {}
ARMED = bool(_ARMED)


@contextmanager
def armed_here(site: str, step: Callable[[], None]) -> Iterator[None]:
    """Arms `site` in this process for the block: each hit runs `step` at the site, before any
    action the environment armed there. For tests: it reaches no other process (a server or a
    worker a test starts is armed by TXHUB_FAILPOINTS, decision 0015)."""
    global ARMED
    if site not in SITES:
        raise ValueError(f"no failpoint site {site!r} (sites: {sorted(SITES)})")
    if site in _STEPS:
        raise ValueError(f"the failpoint {site!r} is armed here already")
    _STEPS[site] = step
    ARMED = True
    try:
        yield
    finally:
        del _STEPS[site]
        ARMED = bool(_ARMED or _STEPS)


def hit_after_commit(name: str) -> None:
    """A site that must fire only once the caller's work is committed: inside an outer
    transaction (a check-back applying an answer, say) nothing is durable yet, so it does not."""
    from django.db import connection

    if not connection.in_atomic_block:
        hit(name)


def hit(name: str) -> None:
    """Call as `if failpoints.ARMED: failpoints.hit("site")`."""
    step = _STEPS.get(name)
    if step is not None:
        step()
    action = _ARMED.get(name)
    if action is None or random.random() >= action.probability:  # noqa: S311 - not crypto
        return
    if action.kind == "exit":
        os._exit(137)  # like SIGKILL: no finally blocks, no response, no flush
    if action.kind == "sleep":
        time.sleep(action.seconds)
        return
    raise FailpointError(f"failpoint {name}")
