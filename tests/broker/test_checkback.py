"""Check-back in one process: claiming, signing, parsing answers and applying them (CONTRACT
section 4, invariants 2 and 7). The end-to-end runs with real Celery are in tests/e2e/."""

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from apps.broker.models import HalfMessage, OpRecord
from apps.broker.services import callbacks, checkback, registry, transactions
from apps.broker.tasks import checkback_run
from tests.checker import verify
from tests.support.transactions import PRODUCER, make_due, make_group, prepare, result

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from seed import seed_pending  # noqa: E402 - bench/seed.py, the backlog its bench seeds too


def test_the_first_check_waits_for_the_timeout_and_immunity_raises_it(
    db: None, settings: Any
) -> None:
    settings.TXHUB_TRANSACTION_TIMEOUT = 6
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    plain = prepare(group, topic)
    immune = prepare(group, topic, check_immunity_seconds=60)
    lower = prepare(group, topic, check_immunity_seconds=1)
    assert plain.next_check_at == plain.born_at + timedelta(seconds=6)
    assert immune.next_check_at == immune.born_at + timedelta(seconds=60)
    assert lower.next_check_at == lower.born_at + timedelta(seconds=6)  # never lowers it
    assert checkback.checkback_claim_due() == []


def test_a_claim_takes_only_due_prepared_transactions_once(db: None) -> None:
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    due, resolved, later = prepare(group, topic), prepare(group, topic), prepare(group, topic)
    make_due(due, resolved)
    transactions.transaction_commit(transaction_id=resolved.transaction_id, actor=PRODUCER)
    assert checkback.checkback_claim_due() == [due.pk]
    assert checkback.checkback_claim_due() == []  # leased
    assert later.pk not in checkback.checkback_claim_due()


def test_concurrent_scans_never_claim_the_same_transaction(
    transactional_db: None, settings: Any
) -> None:
    # No per-group cap here (it would make the total depend on which scan saw which claim): every
    # due row must be claimed by exactly one of the four scans.
    settings.TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP = 1000
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    halves = [prepare(group, topic) for _ in range(200)]
    not_due = prepare(group, topic)
    make_due(*halves)
    barrier = threading.Barrier(4)

    def scan() -> list[int]:
        try:
            barrier.wait(timeout=30)  # the four scans start together
            return checkback.checkback_claim_due()
        finally:
            connection.close()

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(scan) for _ in range(4)]
        claims = [future.result(timeout=60) for future in futures]
    claimed = [pk for claim in claims for pk in claim]
    assert len(claimed) == len(set(claimed))  # no overlap
    assert len(claimed) == len(halves)  # exactly the due count
    assert set(claimed) == {h.pk for h in halves}
    assert not_due.pk not in claimed
    leased = HalfMessage.objects.filter(checking_until__isnull=False)
    assert set(leased.values_list("pk", flat=True)) == set(claimed)


def test_one_slow_group_cannot_take_every_check(db: None, settings: Any) -> None:
    settings.TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP = 3
    topic = registry.topic_create(name="orders", queues=1)
    slow, other = make_group(name="slow"), make_group(name="other")
    slow_halves = [prepare(slow, topic) for _ in range(10)]
    other_halves = [prepare(other, topic) for _ in range(2)]
    make_due(*slow_halves, *other_halves)
    claimed = set(checkback.checkback_claim_due())
    assert len(claimed & {h.pk for h in slow_halves}) == 3
    assert claimed >= {h.pk for h in other_halves}
    make_due(*slow_halves)  # still in flight (leased): no more for the slow group
    HalfMessage.objects.filter(pk__in=claimed).update(
        next_check_at=timezone.now() + timedelta(hours=1)
    )
    assert checkback.checkback_claim_due() == []


def test_one_groups_backlog_does_not_keep_another_groups_check_out_of_the_claim(
    db: None, settings: Any
) -> None:
    """A group with more due checks than a claim looks at (its window) still leaves room for
    every other group's due check: the per-group cap is taken before the claim's global limit
    (CONTRACT section 7, docs/decisions/0009)."""
    settings.TXHUB_CHECK_BATCH = 3  # a window of 12 due rows under the old claim
    settings.TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP = 2
    topic = registry.topic_create(name="orders", queues=1)
    busy, other = make_group(name="busy"), make_group(name="other")
    backlog = [prepare(busy, topic) for _ in range(20)]
    waiting = prepare(other, topic)
    # The backlog has been due longer than the other group's one check.
    for age, half in enumerate(reversed(backlog), start=2):
        HalfMessage.objects.filter(pk=half.pk).update(
            next_check_at=timezone.now() - timedelta(seconds=age)
        )
    make_due(waiting)
    claimed = set(checkback.checkback_claim_due())
    assert waiting.pk in claimed
    # The positive control: the busy group's oldest checks are claimed too, up to its cap.
    assert claimed - {waiting.pk} == {backlog[0].pk, backlog[1].pk}


def _plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """An EXPLAIN plan's node and every node under it."""
    return [node, *(n for child in node.get("Plans", []) for n in _plan_nodes(child))]


def test_a_claim_reads_no_more_of_a_groups_backlog_than_its_cap_whatever_the_plan(
    db: None,
) -> None:
    """A backlog of due checks in one group, of which the per-group cap lets two out, costs a
    claim about the cap's rows even with the planner pushed to nested loops (what stale
    statistics choose): a plan that re-ranked the backlog for each due row was quadratic and
    slowed check-backs most when a backlog built up (docs/decisions/0063); the claim now reads
    each group's due checks only up to its cap."""
    due = 400
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    with connection.cursor() as cursor:
        # Statistics from before the backlog, as autovacuum leaves them while one builds up.
        cursor.execute("ANALYZE broker_halfmessage")
        seed_pending(group=group, topic=topic, pending=due, due=due, tag="backlog")
        cursor.execute("SET LOCAL enable_hashjoin = off")
        cursor.execute("SET LOCAL enable_mergejoin = off")
        cursor.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + checkback.CLAIM_SQL,
            {"lease": 10, "window": 2000, "batch": 500, "per_group": 2, "group": None},
        )
        [(plan,)] = cursor.fetchall()
    nodes = _plan_nodes(plan[0]["Plan"])
    # Rows each node gave and those its filter dropped, times the node's loops.
    read = sum(
        (float(n["Actual Rows"]) + float(n.get("Rows Removed by Filter", 0))) * n["Actual Loops"]
        for n in nodes
    )
    assert HalfMessage.objects.filter(checking_until__isnull=False).count() == 2
    # Stale statistics may still find the leases, or join the chosen rows back to the table, by
    # a pass over the backlog (2-5 rows read per due row, whatever else the table holds);
    # re-ranking it per due row read 800.
    assert read <= 10 * due, read
    # The group's own due checks are read up to its cap, once, however long its backlog.
    [per_group] = [
        n
        for n in nodes
        if n.get("Index Name") == "half_group_due_check_idx"
        and "producer_group_id" in n.get("Index Cond", "")
    ]
    assert (per_group["Actual Rows"], per_group["Actual Loops"]) == (2, 1)


def test_a_finished_check_hands_its_slot_to_its_groups_next_due_check(
    db: None, settings: Any
) -> None:
    """A group's backlog drains as fast as its checks answer, not one cap-full per scan."""
    settings.TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP = 2
    topic = registry.topic_create(name="orders", queues=1)
    busy, other = make_group(name="busy"), make_group(name="other")
    backlog = [prepare(busy, topic) for _ in range(5)]
    others = [prepare(other, topic) for _ in range(3)]
    make_due(*backlog, *others)
    first = checkback.checkback_claim_due()
    mine = [pk for pk in first if pk in {h.pk for h in backlog}]
    assert len(mine) == 2
    # Both slots still held: nothing more for the group, whoever asks.
    assert checkback.checkback_claim_next(after=mine[0]) == []
    HalfMessage.objects.filter(pk__in=[h.pk for h in others]).update(
        checking_until=None, next_check_at=timezone.now() - timedelta(seconds=1)
    )
    assert checkback.checkback_apply(half_id=mine[0], result=result("COMMIT")) == "COMMIT"
    # One slot free: exactly one more of the same group, never another group's due row.
    [following] = checkback.checkback_claim_next(after=mine[0])
    assert following in {h.pk for h in backlog} - set(mine)
    assert checkback.checkback_claim_next(after=mine[0]) == []
    assert HalfMessage.objects.get(pk=following).checking_until is not None


def test_a_check_task_that_starts_after_its_claim_ran_out_checks_nothing(
    db: None, settings: Any
) -> None:
    """A check task lost with Redis holds only its claim's short lease, and a task that starts
    after its claim ran out (or a second copy of one) must not check: another scan may have
    claimed the transaction since (docs/decisions/0005, 0049)."""
    settings.TXHUB_CHECK_DISPATCH_LEASE = 0.5
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    make_due(half)
    [lost] = checkback.checkback_claims()
    assert checkback.checkback_claims() == []  # the claim holds for its lease
    time.sleep(0.6)
    assert not checkback.checkback_start(lost)  # ran out: not started, even unclaimed
    [again] = checkback.checkback_claims()  # due again once the claim ran out
    assert again.half_id == half.pk
    assert not checkback.checkback_start(lost)  # the first claim's task, started late
    assert checkback.checkback_start(again)
    assert not checkback.checkback_start(again)  # a claim starts once
    started = HalfMessage.objects.get(pk=half.pk)
    lease = checkback.check_lease()
    assert started.checking_until is not None
    assert started.checking_until >= again.until + timedelta(seconds=lease - 1)
    assert started.checking_until <= again.until + timedelta(seconds=lease)
    time.sleep(0.6)
    assert checkback.checkback_claims() == []  # the check's lease outlives the claim's


def test_a_started_checks_lease_outlives_its_task(settings: Any) -> None:
    """A second check of a transaction may start only once the first can no longer run: the
    lease ends after the task's hard time limit, where Celery replaces its pool process
    (docs/decisions/0064)."""
    assert checkback_run.soft_time_limit == checkback.check_soft_time_limit()
    assert checkback_run.time_limit == checkback.check_time_limit()
    # The call's own bound comes first; the limits are the backstop past it (decision 0009).
    assert checkback.check_soft_time_limit() > settings.TXHUB_CHECK_HTTP_TIMEOUT
    assert checkback.check_soft_time_limit() < checkback.check_time_limit()
    assert checkback.check_time_limit() < checkback.check_lease()


@pytest.mark.parametrize(
    ("answer", "state", "resolved_by"),
    [("COMMIT", "COMMITTED", "CHECK_BACK"), ("ROLLBACK", "ROLLED_BACK", "CHECK_BACK")],
)
def test_a_decision_resolves_through_the_same_service(
    db: None, answer: str, state: str, resolved_by: str
) -> None:
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    assert checkback.checkback_apply(half_id=half.pk, result=result(answer)) == answer
    half.refresh_from_db()
    assert (half.state, half.resolved_by, half.check_times) == (state, resolved_by, 1)
    ops = list(OpRecord.objects.filter(half=half).order_by("id").values_list("op", "source"))
    assert ops == [("PREPARE", "PRODUCER"), ("CHECK", "CHECK_BACK"), (answer, "CHECK_BACK")]


def test_an_answer_after_the_producer_resolved_is_not_applied(db: None) -> None:
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    transactions.transaction_rollback(transaction_id=half.transaction_id, actor=PRODUCER)
    assert (
        checkback.checkback_apply(half_id=half.pk, result=result("COMMIT")) == "resolved-meanwhile"
    )
    half.refresh_from_db()
    assert half.state == "ROLLED_BACK"
    check = OpRecord.objects.get(half=half, op="CHECK")
    assert check.detail["applied"] is False
    assert OpRecord.objects.filter(half=half, op__in=["COMMIT", "ROLLBACK"]).count() == 1


def test_a_decision_for_a_transaction_parked_meanwhile_is_applied_and_unknown_is_not(
    db: None,
) -> None:
    """PARKED is unresolved (CONTRACT section 1): a check's COMMIT still decides it; an UNKNOWN
    neither resumes checking nor changes it."""
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    decided, undecided = prepare(group, topic), prepare(group, topic)
    for half in (decided, undecided):
        transactions.transaction_park(
            transaction_id=half.transaction_id, actor=checkback.SYSTEM, reason="test"
        )
    assert checkback.checkback_apply(half_id=decided.pk, result=result("COMMIT")) == "COMMIT"
    assert (
        checkback.checkback_apply(half_id=undecided.pk, result=result("UNKNOWN"))
        == "resolved-meanwhile"
    )
    decided.refresh_from_db()
    undecided.refresh_from_db()
    assert (decided.state, decided.resolved_by) == ("COMMITTED", "CHECK_BACK")
    assert (undecided.state, undecided.next_check_at) == ("PARKED", None)


def test_unknown_answers_use_the_budget_then_park(db: None, settings: Any) -> None:
    settings.TXHUB_CHECK_MAX = 3
    settings.TXHUB_CHECK_INTERVAL = 30
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    before = timezone.now()
    assert checkback.checkback_apply(half_id=half.pk, result=result("UNKNOWN")) == "unknown"
    half.refresh_from_db()
    assert half.check_times == 1
    assert half.next_check_at is not None
    assert half.next_check_at >= before + timedelta(seconds=30)
    checkback.checkback_apply(half_id=half.pk, result=result("UNKNOWN"))
    assert checkback.checkback_apply(half_id=half.pk, result=result("UNKNOWN")) == "parked"
    half.refresh_from_db()
    assert half.state == "PARKED"
    assert list(half.ops.values_list("op", flat=True)) == [
        "PREPARE",
        "CHECK",
        "CHECK",
        "CHECK",
        "PARK",
    ]


def test_an_unreachable_callback_backs_off_and_uses_no_budget(db: None, settings: Any) -> None:
    settings.TXHUB_CHECK_MAX = 2
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    delays = []
    for _ in range(5):
        now = timezone.now()
        assert (
            checkback.checkback_apply(half_id=half.pk, result=result("UNKNOWN", reached=False))
            == "unreachable"
        )
        half.refresh_from_db()
        assert half.next_check_at is not None
        delays.append(round((half.next_check_at - now).total_seconds()))
    assert half.state == "PREPARED"
    assert half.check_times == 0
    assert delays == [1, 2, 4, 8, 16]


def test_transactions_older_than_the_max_pending_age_are_parked(db: None, settings: Any) -> None:
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    old, young = prepare(group, topic), prepare(group, topic)
    HalfMessage.objects.filter(pk=old.pk).update(born_at=timezone.now() - timedelta(hours=73))
    assert checkback.checkback_park_stale() == 1
    old.refresh_from_db()
    young.refresh_from_db()
    assert (old.state, young.state) == ("PARKED", "PREPARED")
    assert old.ops.last().source == "SYSTEM"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, b'{"state": "COMMIT"}', "COMMIT"),
        (200, b'{"state": "COMMIT_MESSAGE"}', "COMMIT"),
        (200, b'{"state": "ROLLBACK_MESSAGE"}', "ROLLBACK"),
        (200, b'{"state": "UNKNOW"}', "UNKNOWN"),
        (200, b'{"state": "commit"}', "UNKNOWN"),
        (200, b'{"state": "YES"}', "UNKNOWN"),
        (200, b'"COMMIT"', "UNKNOWN"),
        (200, b"COMMIT", "UNKNOWN"),
        (200, b'{"decision": "COMMIT"}', "UNKNOWN"),
        (500, b'{"state": "COMMIT"}', "UNKNOWN"),
    ],
)
def test_only_a_200_with_a_known_state_is_a_decision(
    db: None, checker: Any, status: int, body: bytes, expected: str
) -> None:
    checker.decide = lambda request: (status, body)
    group, topic = make_group(checker.url), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    outcome = callbacks.call_check_url(
        HalfMessage.objects.select_related("producer_group", "topic").get(pk=half.pk)
    )
    assert outcome.answer == expected
    assert outcome.reached


@pytest.mark.parametrize("status", [302, 307])
def test_a_redirect_to_an_internal_host_is_not_followed_and_not_a_decision(
    db: None, checker: Any, status: int
) -> None:
    """The check URL answers a redirect to another listener on 127.0.0.1 (an internal host the
    producer should not make txhub call) that would answer COMMIT: txhub must not go there, and
    the redirect itself is not a decision."""
    from tests.checker import Checker

    internal = Checker()
    try:
        internal.answer("COMMIT")
        checker.decide = lambda request: (
            status,
            b'{"state": "COMMIT"}',
            {"Location": internal.url.replace("/check", "/internal")},
        )
        group, topic = make_group(checker.url), registry.topic_create(name="orders", queues=1)
        half = prepare(group, topic)
        make_due(half)
        assert checkback.checkback_claim_due() == [half.pk]
        assert checkback.checkback_run(half_id=half.pk) == "unknown"
        assert len(checker.requests) == 1  # the check URL was called (the positive control)
        assert internal.requests == []  # the redirect was not followed
        half.refresh_from_db()
        assert (half.state, half.check_times, half.checking_until) == ("PREPARED", 1, None)
        [check] = OpRecord.objects.filter(half=half, op="CHECK")
        assert check.detail["answer"] == "UNKNOWN"
        assert (check.detail["reached"], check.detail["status"]) == (True, status)
        assert check.detail["applied"] is False
        assert not OpRecord.objects.filter(half=half, op__in=["COMMIT", "ROLLBACK"]).exists()
    finally:
        internal.close()


def test_the_check_is_signed_with_the_groups_secret_and_both_during_rotation(
    db: None, checker: Any
) -> None:
    group, topic = make_group(checker.url), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)

    def fetch() -> HalfMessage:
        return HalfMessage.objects.select_related("producer_group", "topic").get(pk=half.pk)

    callbacks.call_check_url(fetch())
    request = checker.requests[-1]
    assert verify(group.signing_secret, request["headers"], request["raw"])
    assert request["body"]["transaction_id"] == str(half.transaction_id)
    assert request["body"]["body"] == "order 9527"
    assert not verify(group.signing_secret, request["headers"], request["raw"] + b" ")
    rotated = registry.producer_group_rotate_secret(name=group.name)
    callbacks.call_check_url(fetch())
    request = checker.requests[-1]
    assert len(request["headers"]["webhook-signature"].split(" ")) == 2
    assert verify(group.signing_secret, request["headers"], request["raw"])  # the old one
    assert verify(rotated.signing_secret, request["headers"], request["raw"])  # the new one
    ids = {r["headers"]["webhook-id"] for r in checker.requests}
    assert len(ids) == 2  # unique per attempt


def test_a_refused_connection_is_unreachable_not_a_decision(db: None) -> None:
    group, topic = (
        make_group("http://127.0.0.1:9/check"),
        registry.topic_create(name="orders", queues=1),
    )
    half = prepare(group, topic)
    outcome = callbacks.call_check_url(
        HalfMessage.objects.select_related("producer_group", "topic").get(pk=half.pk)
    )
    assert (outcome.answer, outcome.reached) == ("UNKNOWN", False)
    assert outcome.error == "ConnectionError"
