"""How a producer's HTTP answer to a check is read, at each bound (CONTRACT section 4,
docs/decisions/0110): only a 200 decides, an answer of exactly the cap is read and one byte more
is not a decision, and a compressed answer is never read as a plain one. The check task runs
against a real HTTP server of the test's own (tests/checker.py)."""

import gzip
import json
from typing import Any

import pytest

from apps.broker.models import HalfMessage, OpRecord
from apps.broker.services import callbacks, checkback, registry
from tests.support.transactions import make_due, make_group, prepare

COMMIT = b'{"state": "COMMIT"}'


def checked_once(checker: Any) -> HalfMessage:
    """A due transaction of the checker's group, checked once by the check task."""
    group, topic = make_group(checker.url), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    make_due(half)
    assert checkback.checkback_claim_due() == [half.pk]
    checkback.checkback_run(half_id=half.pk)
    assert len(checker.checks_of(str(half.transaction_id))) == 1
    half.refresh_from_db()
    return half


def the_check(half: HalfMessage) -> dict[str, Any]:
    [check] = OpRecord.objects.filter(half=half, op="CHECK")
    return dict(check.detail)


@pytest.mark.parametrize("status", [201, 202, 204, 299])
def test_a_commit_in_another_2xx_is_not_a_decision(db: None, checker: Any, status: int) -> None:
    checker.decide = lambda body: (status, b"" if status == 204 else COMMIT)
    half = checked_once(checker)
    assert (half.state, half.check_times) == ("PREPARED", 1)
    check = the_check(half)
    assert (check["answer"], check["status"], check["error"]) == (
        "UNKNOWN",
        status,
        f"HTTP {status}",
    )
    assert not OpRecord.objects.filter(half=half, op="COMMIT").exists()


def test_a_commit_in_a_200_is_the_positive_control(db: None, checker: Any) -> None:
    checker.decide = lambda body: (200, COMMIT)
    half = checked_once(checker)
    assert (half.state, half.resolved_by) == ("COMMITTED", "CHECK_BACK")


def padded(size: int) -> bytes:
    """A COMMIT answer of exactly `size` bytes: JSON, spaces before it."""
    return b" " * (size - len(COMMIT)) + COMMIT


def test_an_answer_of_exactly_the_cap_is_a_decision(db: None, checker: Any) -> None:
    assert callbacks.MAX_ANSWER_BYTES == 64 * 1024
    checker.decide = lambda body: (200, padded(64 * 1024))
    half = checked_once(checker)
    assert (half.state, half.resolved_by) == ("COMMITTED", "CHECK_BACK")


def test_an_answer_one_byte_over_the_cap_is_not_a_decision(db: None, checker: Any) -> None:
    checker.decide = lambda body: (200, padded(64 * 1024 + 1))
    half = checked_once(checker)
    assert (half.state, half.check_times) == ("PREPARED", 1)
    check = the_check(half)
    assert (check["answer"], check["reached"]) == ("UNKNOWN", True)
    assert check["error"] == "the answer is larger than 65536 bytes"


def test_a_compressed_answer_is_not_read_as_a_decision(db: None, checker: Any) -> None:
    """identity was asked: a gzip answer is not read, whatever it says (compressed, a few bytes
    could stand for more than the cap)."""
    compressed = gzip.compress(json.dumps({"state": "COMMIT"}).encode())
    checker.decide = lambda body: (200, compressed, {"Content-Encoding": "gzip"})
    half = checked_once(checker)
    assert (half.state, half.check_times) == ("PREPARED", 1)
    check = the_check(half)
    assert (check["answer"], check["reached"]) == ("UNKNOWN", True)
    assert check["error"] == "the answer is compressed (identity was asked)"


@pytest.mark.parametrize(
    ("state", "resolved"), [("ROLLBACK", "ROLLED_BACK"), ("COMMIT", "COMMITTED")]
)
def test_the_contracts_own_names_decide(db: None, checker: Any, state: str, resolved: str) -> None:
    checker.answer(state)
    half = checked_once(checker)
    assert (half.state, half.resolved_by) == (resolved, "CHECK_BACK")
