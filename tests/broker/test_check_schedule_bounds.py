"""When a half message is checked again, and when check-back gives up, at each bound (CONTRACT
section 4, docs/decisions/0110): a claim that ran out frees its group's slot, the unreachable
backoff starts again after an answer and stops at its cap, an unreachable check of a transaction
resolved meanwhile uses no budget, and the max pending age and the park scan's batch hold."""

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from apps.broker import failpoints
from apps.broker.models import HalfMessage, OpRecord
from apps.broker.services import checkback, registry, transactions
from tests.support.responses import expect
from tests.support.transactions import PRODUCER, make_due, make_group, prepare, result


def test_a_claim_that_ran_out_frees_its_groups_slot(db: None, settings: Any) -> None:
    """A check task lost with its claim holds the group's slot only for the claim's lease: a
    lease that ran out is no longer in flight, or a group whose tasks were lost would never be
    checked again."""
    settings.TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP = 1
    settings.TXHUB_CHECK_DISPATCH_LEASE = 0.5
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    halves = [prepare(group, topic), prepare(group, topic)]
    make_due(*halves)
    [lost] = checkback.checkback_claim_due()
    assert checkback.checkback_claim_due() == []  # the slot is held while the lease lasts
    time.sleep(0.6)  # the claim's lease runs out; its task never started
    [again] = checkback.checkback_claim_due()
    assert again in {h.pk for h in halves}
    assert lost in {h.pk for h in halves}


def unreachable_delays(half: HalfMessage, count: int) -> list[int]:
    """The delays check-back sets after `count` unreachable checks in a row."""
    delays = []
    for _ in range(count):
        now = timezone.now()
        outcome = checkback.checkback_apply(half_id=half.pk, result=result("UNKNOWN", False))
        assert outcome == "unreachable"
        half.refresh_from_db()
        assert half.next_check_at is not None
        delays.append(round((half.next_check_at - now).total_seconds()))
    return delays


def test_the_unreachable_backoff_stops_at_its_cap(db: None, settings: Any) -> None:
    settings.TXHUB_CHECK_MAX_BACKOFF = 5
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    # 4 s is under the cap and kept; 8 s is over it and cut to 5.
    assert unreachable_delays(half, 5) == [1, 2, 4, 5, 5]


def test_an_answered_check_starts_the_unreachable_backoff_again(db: None, settings: Any) -> None:
    settings.TXHUB_CHECK_INTERVAL = 30
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    assert unreachable_delays(half, 3) == [1, 2, 4]
    now = timezone.now()
    assert checkback.checkback_apply(half_id=half.pk, result=result("UNKNOWN")) == "unknown"
    half.refresh_from_db()
    assert half.next_check_at is not None
    assert round((half.next_check_at - now).total_seconds()) == 30
    assert (half.check_times, half.unreachable_checks) == (1, 0)
    # The producer answered: its next outage backs off from one second, not from eight.
    assert unreachable_delays(half, 2) == [1, 2]


def committing_meanwhile(half: HalfMessage, errors: list[BaseException]) -> Callable[[], None]:
    """The producer's own commit, on a connection of its own, while check-back holds the
    check's answer and has written nothing of it yet."""

    def commit() -> None:
        try:
            transactions.transaction_commit(transaction_id=half.transaction_id, actor=PRODUCER)
        except BaseException as error:  # seen by the test, not lost with the thread
            errors.append(error)
        finally:
            connection.close()

    def step() -> None:
        thread = threading.Thread(target=commit)
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive()

    return step


def test_an_unreachable_check_of_a_transaction_resolved_meanwhile_uses_no_budget(
    transactional_db: None, make_client: Callable[..., APIClient]
) -> None:
    """CONTRACT section 4: a callback that could not be reached does not use up the check
    budget, whether or not the transaction was resolved while it was being called. The check
    is in the history with why it failed."""
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)  # port 9: refused
    half = prepare(group, topic)
    make_due(half)
    assert checkback.checkback_claim_due() == [half.pk]
    errors: list[BaseException] = []
    with failpoints.armed_here(
        "after_check_answer_before_write", committing_meanwhile(half, errors)
    ):
        assert checkback.checkback_run(half_id=half.pk) == "resolved-meanwhile"
    assert errors == []
    producer = make_client("produce:shop", name="producer")
    shown = expect(producer.get(f"/api/v1/transactions/{half.transaction_id}"), 200)
    assert (shown["state"], shown["resolved_by"], shown["check_times"]) == (
        "COMMITTED",
        "PRODUCER",
        0,
    )
    [check] = [op for op in shown["history"] if op["op"] == "CHECK"]
    assert (check["detail"]["reached"], check["detail"]["applied"]) == (False, False)
    assert check["reason"] == "ConnectionError"
    half.refresh_from_db()
    assert (half.unreachable_checks, half.checking_until) == (0, None)


def test_the_max_pending_age_parks_only_what_is_older(db: None, settings: Any) -> None:
    settings.TXHUB_MAX_PENDING_AGE = 3600
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    younger, older = prepare(group, topic), prepare(group, topic)
    now = timezone.now()
    # 30 s either side of the bound: the test's clock and the database's may differ a little.
    HalfMessage.objects.filter(pk=younger.pk).update(born_at=now - timedelta(seconds=3570))
    HalfMessage.objects.filter(pk=older.pk).update(born_at=now - timedelta(seconds=3630))
    assert checkback.checkback_park_stale() == 1
    younger.refresh_from_db()
    older.refresh_from_db()
    assert (younger.state, older.state) == ("PREPARED", "PARKED")
    [park] = OpRecord.objects.filter(half=older, op="PARK")
    assert (park.source, park.reason) == (
        "SYSTEM",
        "unresolved for longer than TXHUB_MAX_PENDING_AGE (3600 s)",
    )


def test_a_park_scan_parks_a_batch_and_leaves_the_rest_to_the_next(db: None, settings: Any) -> None:
    settings.TXHUB_CHECK_BATCH = 2
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    stale = [prepare(group, topic) for _ in range(3)]
    HalfMessage.objects.filter(pk__in=[h.pk for h in stale]).update(
        born_at=timezone.now() - timedelta(hours=73)
    )
    assert checkback.checkback_park_stale() == 2
    assert HalfMessage.objects.filter(state="PARKED").count() == 2
    assert checkback.checkback_park_stale() == 1
    assert checkback.checkback_park_stale() == 0
    assert HalfMessage.objects.filter(state="PARKED").count() == 3
