"""A check URL's host name lookup is part of the call and of its deadline (docs/decisions/0083):
a producer whose name resolves slowly gets a check that ends at TXHUB_CHECK_HTTP_TIMEOUT, is
recorded as unreachable and backs off, and the call still connects only to the address the
lookup answered and the policy checked.

The slow DNS is tests/support/slow_dns.py (the `slow_dns` fixture)."""

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from apps.broker.models import HalfMessage, OpRecord
from apps.broker.services import callbacks, checkback, registry
from tests.hostile import HostileEndpoint
from tests.support.slow_dns import DEADLINE
from tests.support.transactions import make_due, make_group, prepare

TIMEOUT = DEADLINE
MARGIN = 1.0  # past the deadline: a busy machine's delays, never a second lookup or call


def with_host(url: str, host: str) -> str:
    return url.replace("127.0.0.1", host)


def fetch(half: HalfMessage) -> HalfMessage:
    return HalfMessage.objects.select_related("producer_group", "topic").get(pk=half.pk)


def test_a_lookup_slower_than_the_deadline_ends_the_call_at_the_deadline(
    db: None, checker: Any, slow_dns: Callable[..., None]
) -> None:
    checker.answer("COMMIT")
    group, topic = make_group(checker.url), registry.topic_create(name="orders", queues=1)
    half = fetch(prepare(group, topic))
    slow_dns(6 * TIMEOUT)
    started = time.monotonic()
    outcome = callbacks.call_check_url(half)
    took = time.monotonic() - started
    assert took < TIMEOUT + MARGIN, f"the call took {took:.2f} s"
    assert (outcome.answer, outcome.reached) == ("UNKNOWN", False)
    assert outcome.error == "the host name was not resolved within TXHUB_CHECK_HTTP_TIMEOUT (1 s)"
    assert checker.requests == []


def test_a_check_whose_lookup_overruns_is_unreachable_and_backs_off(
    db: None, checker: Any, slow_dns: Callable[..., None]
) -> None:
    checker.answer("COMMIT")
    group, topic = make_group(checker.url), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    make_due(half)
    assert checkback.checkback_claim_due() == [half.pk]
    slow_dns(6 * TIMEOUT)
    started = time.monotonic()
    assert checkback.checkback_run(half_id=half.pk) == "unreachable"
    assert time.monotonic() - started < TIMEOUT + MARGIN
    half.refresh_from_db()
    assert (half.state, half.check_times, half.unreachable_checks) == ("PREPARED", 0, 1)
    [check] = OpRecord.objects.filter(half=half, op="CHECK")
    # The backoff's first step (1 s) from the attempt (its `at` is the same instant), not the
    # end of the lease the check took when it started.
    assert (half.checking_until, half.next_check_at) == (None, check.at + timedelta(seconds=1))
    assert check.detail["reached"] is False
    assert "not resolved within TXHUB_CHECK_HTTP_TIMEOUT" in check.detail["error"]
    assert checker.requests == []


def test_a_slow_lookup_uses_up_the_deadline_it_shares_with_the_call(
    db: None, slow_dns: Callable[..., None], settings: Any
) -> None:
    """A lookup that answers in time leaves the call only what is left of the deadline: an
    endpoint that drips its answer is cut at TXHUB_CHECK_HTTP_TIMEOUT from the lookup's start."""
    settings.TXHUB_CHECK_HTTP_TIMEOUT = 2.0
    endpoint = HostileEndpoint("drip-body")
    try:
        group = make_group(endpoint.url)
        topic = registry.topic_create(name="orders", queues=1)
        half = fetch(prepare(group, topic))
        slow_dns(1.5)
        started = time.monotonic()
        outcome = callbacks.call_check_url(half)
        took = time.monotonic() - started
    finally:
        endpoint.close()
    assert endpoint.requests == 1  # the lookup answered in time and the call was made
    assert took < 2.0 + MARGIN, f"the call took {took:.2f} s"
    assert outcome.answer == "UNKNOWN"
    assert outcome.error == "no complete answer within TXHUB_CHECK_HTTP_TIMEOUT (2 s)"


def test_a_slow_lookup_in_time_still_commits_at_the_address_it_answered(
    db: None, checker: Any, slow_dns: Callable[..., None]
) -> None:
    """The positive control: a lookup that answers within the deadline, for a name real DNS does
    not know, reaches the real local producer at the checked address, and its COMMIT applies."""
    checker.answer("COMMIT")
    slow_dns(0.2)
    url = with_host(checker.url, "slow-dns.invalid")
    group, topic = make_group(url), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    make_due(half)
    assert checkback.checkback_claim_due() == [half.pk]
    assert checkback.checkback_run(half_id=half.pk) == "COMMIT"
    half.refresh_from_db()
    assert (half.state, half.resolved_by) == ("COMMITTED", "CHECK_BACK")
    [request] = checker.requests
    assert request["headers"]["host"] == url.split("/")[2]


def test_a_slow_lookup_of_an_internal_address_is_still_refused(
    db: None, checker: Any, slow_dns: Callable[..., None]
) -> None:
    checker.answer("COMMIT")
    group, topic = make_group(checker.url), registry.topic_create(name="orders", queues=1)
    half = fetch(prepare(group, topic))
    slow_dns(0.2, "169.254.169.254")
    outcome = callbacks.call_check_url(half)
    assert (outcome.answer, outcome.reached) == ("UNKNOWN", False)
    assert "169.254.169.254" in outcome.error
    assert checker.requests == []
