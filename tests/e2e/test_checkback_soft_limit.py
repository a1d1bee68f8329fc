"""The check task's soft time limit is the backstop behind the call's own deadline (decisions
0009, 0083): a call that outlasts it, in a real Celery callbacks worker, ends as an unreachable
attempt that is recorded and backs off, instead of a task that dies and leaves its transaction
to be claimed again every lease with no record and no backoff.

The stall is the failpoint site `during_check_call` (docs/decisions/0015), asleep inside the
call for longer than the soft limit: the way any part of a call that ignored its deadline would
hold the task."""

from datetime import timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.broker.models import HalfMessage, OpRecord
from tests.support.responses import expect
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

CALL_TIMEOUT = 1  # s: TXHUB_CHECK_HTTP_TIMEOUT in the worker, so its soft limit is 6 s
SOFT_LIMIT_MS = (CALL_TIMEOUT + 5) * 1000
HARD_LIMIT_MS = (CALL_TIMEOUT + 10) * 1000


def test_a_call_ended_by_the_soft_time_limit_is_recorded_unreachable_and_backs_off(
    start_celery: Any, api: APIClient, checker: Any
) -> None:
    checker.answer("COMMIT")
    expect(api.post("/api/v1/topics", {"name": "orders", "queues": 1}, format="json"), 201)
    group = {"name": "shop", "check_url": checker.url}
    expect(api.post("/api/v1/producer-groups", group, format="json"), 201)
    start_celery(
        TXHUB_CHECK_HTTP_TIMEOUT=str(CALL_TIMEOUT),
        TXHUB_FAILPOINTS="during_check_call=sleep(60)",
        TXHUB_ALLOW_FAILPOINTS="1",
    )
    prepared = expect(
        api.post(
            "/api/v1/transactions",
            {"producer_group": "shop", "topic": "orders", "body": "order 9527"},
            format="json",
        ),
        201,
    )

    def first_check() -> tuple[OpRecord, HalfMessage] | None:
        """The first CHECK op and the half row read at once: the backoff's next check is 1 s
        after it, so a poll every 0.1 s sees the row before the next claim moves it."""
        checks = OpRecord.objects.filter(half__transaction_id=prepared["transaction_id"])
        check = checks.filter(op="CHECK").order_by("id").first()
        # Read after the op: both were written in one transaction.
        return None if check is None else (check, HalfMessage.objects.get(pk=check.half_id))

    # Due 1 s after prepare, then the soft limit 6 s into its task (generous bound).
    check, half = wait_until(first_check, timeout=30, interval=0.1)
    assert check.detail["error"] == "the check task's soft time limit ended the call"
    assert (check.detail["answer"], check.detail["reached"]) == ("UNKNOWN", False)
    # Ended by the soft limit, well before the hard one replaces the process.
    assert SOFT_LIMIT_MS - 1000 < check.detail["latency_ms"] < HARD_LIMIT_MS - 2000
    assert half.state == "PREPARED"
    assert half.check_times == 0  # no answer: the check budget is untouched
    # The backoff applies: the next check 1 s after the attempt (its `at` is the same instant),
    # not when the lease runs out (its start + the hard limit + 5 s) with nothing written.
    assert (half.unreachable_checks, half.checking_until) == (1, None)
    assert half.next_check_at == check.at + timedelta(seconds=1)
    assert checker.requests == []  # the stall came before the request was sent
