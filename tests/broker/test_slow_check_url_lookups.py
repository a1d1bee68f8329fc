"""A check URL's host name lookup is part of the call and of its deadline (docs/decisions/0083):
a producer whose name resolves slowly gets a check that ends at TXHUB_CHECK_HTTP_TIMEOUT, is
recorded as unreachable and backs off, and the call still connects only to the address the
lookup answered and the policy checked.

The slow DNS is a DNS server of the test's own, asked by glibc's getaddrinfo in a process of the
test's own (tests/support/slow_dns.py, the `slow_dns` fixture; docs/decisions/0096)."""

from datetime import timedelta
from typing import Any

from apps.broker.models import OpRecord
from apps.broker.services import registry
from tests.hostile import HostileEndpoint
from tests.support.slow_dns import DEADLINE, SLOW_HOST, SlowDns, slow_group
from tests.support.transactions import make_due, prepare

TIMEOUT = DEADLINE
MARGIN = 1.0  # past the deadline: a busy machine's delays, never a second lookup or call


def test_a_lookup_slower_than_the_deadline_ends_the_call_at_the_deadline(
    checker: Any, slow_dns: SlowDns
) -> None:
    checker.answer("COMMIT")
    group, topic = slow_group(checker.url), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    slow_dns.arm(6 * TIMEOUT)
    [outcome] = slow_dns.run("calls", half_id=half.pk, count=1)["outcomes"]
    assert outcome["took"] < TIMEOUT + MARGIN, f"the call took {outcome['took']:.2f} s"
    assert (outcome["answer"], outcome["reached"]) == ("UNKNOWN", False)
    assert (
        outcome["error"] == "the host name was not resolved within TXHUB_CHECK_HTTP_TIMEOUT (1 s)"
    )
    assert slow_dns.queries > 0  # the lookup asked the test's DNS server
    assert checker.requests == []


def test_a_check_whose_lookup_overruns_is_unreachable_and_backs_off(
    checker: Any, slow_dns: SlowDns
) -> None:
    checker.answer("COMMIT")
    group, topic = slow_group(checker.url), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    make_due(half)
    slow_dns.arm(6 * TIMEOUT)
    checked = slow_dns.run("check", half_id=half.pk)
    assert checked["claimed"] == [half.pk]
    assert checked["result"] == "unreachable"
    assert checked["took"] < TIMEOUT + MARGIN
    half.refresh_from_db()
    assert (half.state, half.check_times, half.unreachable_checks) == ("PREPARED", 0, 1)
    [check] = OpRecord.objects.filter(half=half, op="CHECK")
    # The backoff's first step (1 s) from the attempt (its `at` is the same instant), not the
    # end of the lease the check took when it started.
    assert (half.checking_until, half.next_check_at) == (None, check.at + timedelta(seconds=1))
    assert check.detail["reached"] is False
    assert "not resolved within TXHUB_CHECK_HTTP_TIMEOUT" in check.detail["error"]
    assert checker.requests == []


def test_a_slow_lookup_uses_up_the_deadline_it_shares_with_the_call(slow_dns: SlowDns) -> None:
    """A lookup that answers in time leaves the call only what is left of the deadline: an
    endpoint that drips its answer is cut at TXHUB_CHECK_HTTP_TIMEOUT from the lookup's start."""
    endpoint = HostileEndpoint("drip-body")
    try:
        group = slow_group(endpoint.url)
        topic = registry.topic_create(name="orders", queues=1)
        half = prepare(group, topic)
        slow_dns.arm(1.5)
        [outcome] = slow_dns.run(
            "calls", {"TXHUB_CHECK_HTTP_TIMEOUT": 2.0}, half_id=half.pk, count=1
        )["outcomes"]
    finally:
        endpoint.close()
    assert endpoint.requests == 1  # the lookup answered in time and the call was made
    assert outcome["took"] < 2.0 + MARGIN, f"the call took {outcome['took']:.2f} s"
    assert outcome["answer"] == "UNKNOWN"
    assert outcome["error"] == "no complete answer within TXHUB_CHECK_HTTP_TIMEOUT (2 s)"


def test_a_slow_lookup_in_time_still_commits_at_the_address_it_answered(
    checker: Any, slow_dns: SlowDns
) -> None:
    """The positive control: a lookup that answers within the deadline, for a name real DNS does
    not know, reaches the real local producer at the checked address, and its COMMIT applies."""
    checker.answer("COMMIT")
    slow_dns.arm(0.2)
    group, topic = slow_group(checker.url), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    make_due(half)
    checked = slow_dns.run("check", half_id=half.pk)
    assert checked["claimed"] == [half.pk]
    assert checked["result"] == "COMMIT"
    half.refresh_from_db()
    assert (half.state, half.resolved_by) == ("COMMITTED", "CHECK_BACK")
    [request] = checker.requests
    assert request["headers"]["host"] == group.check_url.split("/")[2]
    assert group.check_url.split("/")[2].startswith(SLOW_HOST + ":")


def test_a_slow_lookup_of_an_internal_address_is_still_refused(
    checker: Any, slow_dns: SlowDns
) -> None:
    checker.answer("COMMIT")
    group, topic = slow_group(checker.url), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    slow_dns.arm(0.2, "169.254.169.254")
    [outcome] = slow_dns.run("calls", half_id=half.pk, count=1)["outcomes"]
    assert (outcome["answer"], outcome["reached"]) == ("UNKNOWN", False)
    assert "169.254.169.254" in outcome["error"]
    assert checker.requests == []
