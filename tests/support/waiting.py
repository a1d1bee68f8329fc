"""Waiting for an observable instead of sleeping a guessed time."""

import time
from collections.abc import Callable
from typing import Any


class WaitTimeout(AssertionError):
    """A condition that did not hold in time; `last` is what it gave on the last try."""

    def __init__(self, timeout: float, last: Any) -> None:
        super().__init__(f"not true within {timeout} s; the last value was {last!r}")
        self.last = last


def wait_until(predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.2) -> Any:
    """The first true value `predicate` gives, tried every `interval` seconds; raises WaitTimeout
    (an AssertionError, with the last value) when none came within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    value = predicate()
    if value:
        return value
    raise WaitTimeout(timeout, value)
