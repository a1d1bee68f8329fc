"""A process holds a bounded number of check URL lookups left behind at their deadline
(docs/decisions/0087): past TXHUB_CHECK_MAX_ABANDONED_LOOKUPS, a new lookup fails at once, a
check as unreachable (recorded, backed off) and a registration as the check URL's 400; once the
lookups left behind end, lookups run again.

The slow DNS is a DNS server of the test's own, asked by glibc's getaddrinfo in a process of the
test's own (tests/support/slow_dns.py, the `slow_dns` fixture; docs/decisions/0096)."""

from datetime import timedelta
from typing import Any

from apps.broker.models import OpRecord, ProducerGroup
from apps.broker.services import registry
from tests.support.responses import assert_error
from tests.support.slow_dns import NEVER, Answer, SlowDns, slow_group
from tests.support.transactions import make_due, prepare

BOUND = 2
AT_ONCE = 0.3  # s: a refused lookup starts no thread and waits for nothing
MARGIN = 1.0  # past the deadline: a busy machine's delays
BOUND_TEXT = "lookups that outlasted their deadline are still waiting in this process"
WITH_BOUND = {"TXHUB_CHECK_MAX_ABANDONED_LOOKUPS": BOUND}


def assert_left_behind(outcomes: list[dict[str, Any]]) -> None:
    """The checks whose lookups overran the deadline and were left behind."""
    assert len(outcomes) == BOUND
    for outcome in outcomes:
        assert "not resolved within TXHUB_CHECK_HTTP_TIMEOUT" in outcome["error"]


def test_a_burst_of_hung_lookups_leaves_at_most_the_bound_behind(
    checker: Any, slow_dns: SlowDns
) -> None:
    half = prepare(slow_group(checker.url), registry.topic_create(name="orders", queues=1))
    slow_dns.arm(NEVER)
    called = slow_dns.run("calls", WITH_BOUND, half_id=half.pk, count=BOUND + 3)
    assert_left_behind(called["outcomes"][:BOUND])
    for outcome in called["outcomes"][BOUND:]:
        assert outcome["took"] < AT_ONCE, f"the call took {outcome['took']:.2f} s"
        assert (outcome["answer"], outcome["reached"]) == ("UNKNOWN", False)
        assert outcome["error"] == (
            f"the host name was not looked up: {BOUND} {BOUND_TEXT} "
            "(TXHUB_CHECK_MAX_ABANDONED_LOOKUPS)"
        )
    assert called["lookup_threads"] == BOUND
    assert checker.requests == []


def test_a_check_refused_by_the_bound_is_unreachable_and_backs_off(
    checker: Any, slow_dns: SlowDns
) -> None:
    checker.answer("COMMIT")
    half = prepare(slow_group(checker.url), registry.topic_create(name="orders", queues=1))
    make_due(half)
    slow_dns.arm(NEVER)
    checked = slow_dns.run("check", WITH_BOUND, half_id=half.pk, leave_behind=BOUND)
    assert_left_behind(checked["left"])
    assert checked["claimed"] == [half.pk]
    assert checked["result"] == "unreachable"
    assert checked["took"] < AT_ONCE + MARGIN
    half.refresh_from_db()
    assert (half.state, half.check_times, half.unreachable_checks) == ("PREPARED", 0, 1)
    [check] = OpRecord.objects.filter(half=half, op="CHECK")
    assert (half.checking_until, half.next_check_at) == (None, check.at + timedelta(seconds=1))
    assert check.detail["reached"] is False
    assert BOUND_TEXT in check.detail["error"]
    assert checker.requests == []


def test_a_registration_refused_by_the_bound_is_the_check_urls_400(slow_dns: SlowDns) -> None:
    half = prepare(
        slow_group("http://127.0.0.1:9/check"), registry.topic_create(name="orders", queues=1)
    )
    _, token = registry.token_create(name="admin-test", scopes=["admin"])
    slow_dns.arm(NEVER)
    asked = slow_dns.run(
        "requests",
        WITH_BOUND,
        steps=[
            {
                "method": "post",
                "path": "/api/v1/producer-groups",
                "data": {"name": "pg", "check_url": "http://producer.invalid:9/check"},
            }
        ],
        token=token,
        half_id=half.pk,
        leave_behind=BOUND,
    )
    assert_left_behind(asked["left"])
    [response] = [Answer(answer) for answer in asked["answers"]]
    assert response.took < AT_ONCE + MARGIN, f"the request took {response.took:.2f} s"
    error = assert_error(response, 400, "invalid_request")
    message = (
        f"The host 'producer.invalid' was not looked up: {BOUND} {BOUND_TEXT} "
        "(TXHUB_CHECK_MAX_ABANDONED_LOOKUPS)."
    )
    assert (error["message"], error["details"]) == (message, {"check_url": [message]})
    assert not ProducerGroup.objects.filter(name="pg").exists()


def test_lookups_run_again_once_those_left_behind_end(checker: Any, slow_dns: SlowDns) -> None:
    """The control: the bound counts only lookups still waiting; when they end (the DNS server
    answers the queries it held), a check whose lookup answers reaches the producer and its
    COMMIT applies."""
    checker.answer("COMMIT")
    half = prepare(slow_group(checker.url), registry.topic_create(name="orders", queues=1))
    make_due(half)
    slow_dns.arm(NEVER)
    probe = slow_dns.start("check", WITH_BOUND, half_id=half.pk, leave_behind=BOUND, pause=True)
    probe.wait_for_pause()
    slow_dns.release()
    probe.resume()
    checked = probe.result()
    assert_left_behind(checked["left"])
    assert checked["lookup_threads"] == 0
    assert checked["claimed"] == [half.pk]
    assert checked["result"] == "COMMIT"
    half.refresh_from_db()
    assert (half.state, half.resolved_by) == ("COMMITTED", "CHECK_BACK")
