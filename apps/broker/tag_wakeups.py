"""Which waiting receives expired messages wake, by their tags (docs/decisions/0081).

The wake-up hub's fallback check (wakeups.py) counts a (topic, group)'s expired in-flight
messages per tag when a waiter of the pair filters by tag. A message wakes only a waiter whose
filter takes it: one that takes none of them would run a receive that finds nothing, every
check, for as long as they stay expired. The filters and the tags are the clients' to choose, so
the cost here is one pass over the waiters, each looking at no more tags than its filter or the
tags left hold, whichever is fewer; never waiters times tags.
"""

from collections.abc import Collection, Iterable
from typing import Protocol, TypeVar

Tags = frozenset[str] | None  # a receive's tag filter: None takes every message


class Filtered(Protocol):
    """A waiting receive as seen here: its filter and how many messages one try takes."""

    @property
    def tags(self) -> Tags: ...

    @property
    def wants(self) -> int: ...


W = TypeVar("W", bound=Filtered)


def takes_any(tags: Tags, found: Collection[str | None]) -> bool:
    """Whether the filter `tags` takes any of the messages found, given by their tags (None: a
    message any waiter takes, e.g. a new offset)."""
    if not found:
        return False
    if tags is None or None in found:
        return True
    small, big = (tags, found) if len(tags) <= len(found) else (found, tags)
    return any(tag in big for tag in small)


def to_wake(waiters: Iterable[W], counts: dict[str, int]) -> list[W]:
    """Among `waiters` (oldest first, none of them woken yet), those that `counts` (expired
    messages per tag) wake: each whose filter takes a tag with messages left, counted for up to
    its `wants` of them, until none is left."""
    left = {tag: count for tag, count in counts.items() if count > 0}
    woken = []
    for waiter in waiters:
        if not left:
            break
        wants = waiter.wants
        if waiter.tags is None:  # any tag: taken from the end, each step O(1)
            while wants > 0 and left:
                tag, count = left.popitem()
                if count > wants:
                    left[tag] = count - wants
                wants -= count
        else:
            mine = _common(waiter.tags, left)
            if not mine:
                continue
            for tag in mine:
                took = min(wants, left[tag])
                left[tag] -= took
                if not left[tag]:
                    del left[tag]
                wants -= took
                if wants <= 0:
                    break
        woken.append(waiter)
    return woken


def _common(tags: frozenset[str], left: dict[str, int]) -> list[str]:
    if len(tags) <= len(left):
        return [tag for tag in tags if tag in left]
    return [tag for tag in left if tag in tags]
