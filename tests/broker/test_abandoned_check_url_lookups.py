"""A process holds a bounded number of check URL lookups left behind at their deadline
(docs/decisions/0087): past TXHUB_CHECK_MAX_ABANDONED_LOOKUPS, a new lookup fails at once, a
check as unreachable (recorded, backed off) and a registration as the check URL's 400; once the
lookups left behind end, lookups run again.

The slow DNS is tests/support/slow_dns.py (the `slow_dns` fixture)."""

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from rest_framework.test import APIClient

from apps.broker.models import HalfMessage, OpRecord, ProducerGroup
from apps.broker.services import callbacks, checkback, registry
from tests.support.responses import assert_error
from tests.support.slow_dns import DEADLINE, SlowDns, lookup_threads
from tests.support.transactions import make_due, make_group, prepare

BOUND = 2
AT_ONCE = 0.3  # s: a refused lookup starts no thread and waits for nothing
MARGIN = 1.0  # past the deadline: a busy machine's delays
BOUND_TEXT = "lookups that outlasted their deadline are still waiting in this process"


def fetch(half: HalfMessage) -> HalfMessage:
    return HalfMessage.objects.select_related("producer_group", "topic").get(pk=half.pk)


def leave_lookups_behind(half: HalfMessage, count: int) -> None:
    """`count` checks of `half` whose lookups overrun the deadline and are left behind."""
    for _ in range(count):
        outcome = callbacks.call_check_url(half)
        assert "not resolved within TXHUB_CHECK_HTTP_TIMEOUT" in outcome.error


def test_a_burst_of_hung_lookups_leaves_at_most_the_bound_behind(
    db: None, settings: Any, checker: Any, slow_dns: Callable[..., None]
) -> None:
    settings.TXHUB_CHECK_MAX_ABANDONED_LOOKUPS = BOUND
    half = fetch(prepare(make_group(checker.url), registry.topic_create(name="orders", queues=1)))
    slow_dns(60)
    leave_lookups_behind(half, BOUND)
    for _ in range(3):
        started = time.monotonic()
        outcome = callbacks.call_check_url(half)
        took = time.monotonic() - started
        assert took < AT_ONCE, f"the call took {took:.2f} s"
        assert (outcome.answer, outcome.reached) == ("UNKNOWN", False)
        assert outcome.error == (
            f"the host name was not looked up: {BOUND} {BOUND_TEXT} "
            "(TXHUB_CHECK_MAX_ABANDONED_LOOKUPS)"
        )
    assert len(lookup_threads()) == BOUND
    assert checker.requests == []


def test_a_check_refused_by_the_bound_is_unreachable_and_backs_off(
    db: None, settings: Any, checker: Any, slow_dns: Callable[..., None]
) -> None:
    settings.TXHUB_CHECK_MAX_ABANDONED_LOOKUPS = BOUND
    checker.answer("COMMIT")
    half = prepare(make_group(checker.url), registry.topic_create(name="orders", queues=1))
    slow_dns(60)
    leave_lookups_behind(fetch(half), BOUND)
    make_due(half)
    assert checkback.checkback_claim_due() == [half.pk]
    started = time.monotonic()
    assert checkback.checkback_run(half_id=half.pk) == "unreachable"
    assert time.monotonic() - started < AT_ONCE + MARGIN
    half.refresh_from_db()
    assert (half.state, half.check_times, half.unreachable_checks) == ("PREPARED", 0, 1)
    [check] = OpRecord.objects.filter(half=half, op="CHECK")
    assert (half.checking_until, half.next_check_at) == (None, check.at + timedelta(seconds=1))
    assert check.detail["reached"] is False
    assert BOUND_TEXT in check.detail["error"]
    assert checker.requests == []


def test_a_registration_refused_by_the_bound_is_the_check_urls_400(
    api: APIClient, settings: Any, slow_dns: Callable[..., None]
) -> None:
    settings.TXHUB_CHECK_MAX_ABANDONED_LOOKUPS = BOUND
    half = fetch(prepare(make_group(), registry.topic_create(name="orders", queues=1)))
    slow_dns(60)
    leave_lookups_behind(half, BOUND)
    started = time.monotonic()
    response = api.post(
        "/api/v1/producer-groups",
        {"name": "pg", "check_url": "http://producer.invalid:9/check"},
        format="json",
    )
    took = time.monotonic() - started
    assert took < AT_ONCE + MARGIN, f"the request took {took:.2f} s"
    error = assert_error(response, 400, "invalid_request")
    message = (
        f"The host 'producer.invalid' was not looked up: {BOUND} {BOUND_TEXT} "
        "(TXHUB_CHECK_MAX_ABANDONED_LOOKUPS)."
    )
    assert (error["message"], error["details"]) == (message, {"check_url": [message]})
    assert not ProducerGroup.objects.filter(name="pg").exists()


def test_lookups_run_again_once_those_left_behind_end(
    db: None, settings: Any, checker: Any, monkeypatch: Any
) -> None:
    """The control: the bound counts only lookups still waiting; when they end, a check whose
    lookup answers reaches the producer and its COMMIT applies."""
    settings.TXHUB_CHECK_MAX_ABANDONED_LOOKUPS = BOUND
    settings.TXHUB_CHECK_HTTP_TIMEOUT = DEADLINE
    checker.answer("COMMIT")
    half = prepare(make_group(checker.url), registry.topic_create(name="orders", queues=1))
    dns = SlowDns(monkeypatch)
    dns.arm(60)
    try:
        leave_lookups_behind(fetch(half), BOUND)
    finally:
        dns.release()
    assert lookup_threads() == []
    make_due(half)
    assert checkback.checkback_claim_due() == [half.pk]
    assert checkback.checkback_run(half_id=half.pk) == "COMMIT"
    half.refresh_from_db()
    assert (half.state, half.resolved_by) == ("COMMITTED", "CHECK_BACK")
