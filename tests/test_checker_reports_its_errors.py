"""The fake producer (tests/checker.py) must not hide its own failures: an exception in a request
thread fails the test at close(), and a well-behaved exchange does not."""

from typing import Any

import pytest
import requests

from tests.checker import Checker


def test_an_exception_in_decide_fails_the_test_at_close() -> None:
    checker = Checker()

    def broken(body: dict[str, Any]) -> Any:
        raise KeyError("transaction_id")

    checker.decide = broken
    with pytest.raises(requests.ConnectionError):
        requests.post(checker.url, json={"a": 1}, timeout=5)
    with pytest.raises(AssertionError, match="KeyError"):
        checker.close()


def test_a_good_exchange_closes_cleanly() -> None:
    checker = Checker()
    checker.answer("COMMIT")
    answer = requests.post(checker.url, json={"transaction_id": "t"}, timeout=5)
    assert answer.json() == {"state": "COMMIT"}
    assert len(checker.checks_of("t")) == 1
    checker.close()
