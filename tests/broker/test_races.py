"""Races on real Postgres, threads released together by a barrier (CONTRACT invariants 2, 6, 7):
a check-back answer, the producer's commit and an operator's action on one transaction; two
consumers of one group receiving at once; a claimed check whose transaction was resolved before
the check ran."""

import random
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar

from django.db import connection
from django.utils import timezone

from apps.broker.models import (
    CommitLogEntry,
    ConsumerGroup,
    Delivery,
    HalfMessage,
    OpRecord,
    ProducerGroup,
    Resolver,
    Topic,
)
from apps.broker.services import checkback, consuming, operator, registry, transactions
from apps.broker.services.callbacks import CheckResult
from apps.broker.services.errors import TransactionResolved
from apps.broker.services.sending import OutgoingMessage, message_send
from apps.broker.services.transactions import Actor

PRODUCER = Actor(Resolver.PRODUCER, "test")
ROUNDS = 25
T = TypeVar("T")


def in_own_connection(barrier: threading.Barrier, work: Callable[[], T]) -> T:
    """Runs in a pool thread (Django opens a connection per thread): waits for the others, so
    all start together, then closes its connection."""
    try:
        barrier.wait(timeout=30)
        return work()
    finally:
        connection.close()


def prepare(group: ProducerGroup, topic: Topic, body: str) -> HalfMessage:
    message = OutgoingMessage(producer_group=group.name, body=body.encode(), body_is_binary=False)
    return transactions.transaction_prepare(
        producer_group=group, topic=topic, message=message, actor=PRODUCER
    )


def test_check_back_producer_commit_and_operator_race_to_exactly_one_outcome(
    transactional_db: None,
) -> None:
    """Each round: the check-back answer, the producer's commit and an operator's action start
    at once on one PREPARED transaction. Exactly one of them decides (one final op, its source
    is resolved_by); every other party is told so (409, resolved-meanwhile, "Nothing done"),
    except a producer asking for the outcome that won, which gets its 200 (idempotent)."""
    topic = registry.topic_create(name="orders", queues=2)
    group = registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    rng = random.Random(9527)  # noqa: S311 - varied, repeatable answers
    winners: Counter[str] = Counter()
    for round_no in range(ROUNDS):
        half = prepare(group, topic, f"order {round_no}")
        answer = rng.choice(["COMMIT", "ROLLBACK"])
        action = rng.choice(["commit", "rollback"])
        barrier = threading.Barrier(3)

        def check_back(half_id: int = half.pk, answer: str = answer) -> str:
            result = CheckResult(answer, True, 200, "", 5, f"msg_race_{half_id}")
            return checkback.checkback_apply(half_id=half_id, result=result)

        def producer_commit(transaction_id: Any = half.transaction_id) -> str:
            try:
                transactions.transaction_commit(transaction_id=transaction_id, actor=PRODUCER)
            except TransactionResolved as error:
                return f"409 {error.details['state']}"
            return "200"

        def operator_action(transaction_id: Any = half.transaction_id, action: str = action) -> Any:
            return operator.operator_act(
                transaction_id=transaction_id, action=action, username="otto", reason="race"
            )

        with ThreadPoolExecutor(3) as pool:
            futures = [
                pool.submit(in_own_connection, barrier, work)
                for work in (check_back, producer_commit, operator_action)
            ]
            checked, produced, operated = (future.result(timeout=60) for future in futures)

        half.refresh_from_db()
        finals = list(OpRecord.objects.filter(half=half, op__in=["COMMIT", "ROLLBACK"]))
        context = (round_no, answer, action, checked, produced, operated, half.state)
        assert len(finals) == 1, context
        [final] = finals
        assert half.state == {"COMMIT": "COMMITTED", "ROLLBACK": "ROLLED_BACK"}[final.op], context
        assert final.source == half.resolved_by, context
        winners[str(half.resolved_by)] += 1
        entries = CommitLogEntry.objects.filter(transaction_id=half.transaction_id).count()
        assert entries == (1 if half.state == "COMMITTED" else 0), context
        # The check-back recorded its one check, applied only if it decided.
        [check] = OpRecord.objects.filter(half=half, op="CHECK")
        assert check.detail["applied"] is (half.resolved_by == "CHECK_BACK"), context
        # What each party was told agrees with the one outcome.
        if half.resolved_by == "CHECK_BACK":
            assert (checked, final.op) == (answer, answer), context
        else:
            assert checked == "resolved-meanwhile", context
        assert operated.ok is (half.resolved_by == "OPERATOR"), context
        if half.resolved_by == "OPERATOR":
            assert final.op == action.upper(), context
        assert produced == ("200" if half.state == "COMMITTED" else "409 ROLLED_BACK"), context
        if half.resolved_by == "PRODUCER":
            assert final.op == "COMMIT", context
    # The rounds were real races, not one party always first.
    assert len(winners) >= 2, winners


def test_two_consumers_of_one_group_never_get_the_same_message_at_once(
    transactional_db: None,
) -> None:
    """Two consumers of one group receive together until nothing is left: each message is
    handed out exactly once, never to both within its invisible time. Then every invisible time
    is made to pass and they race again over the redeliveries: the same again."""
    topic = registry.topic_create(name="orders", queues=3)
    group = registry.consumer_group_create(
        name="billing", max_delivery_attempts=16, consume_from="first"
    )
    sent = {
        message_send(
            topic=topic,
            message=OutgoingMessage(
                producer_group="shop", body=f"m{i}".encode(), body_is_binary=False
            ),
        ).msg_id
        for i in range(90)
    }

    def race() -> list[list[str]]:
        barrier = threading.Barrier(2)

        def consume() -> list[str]:
            got: list[str] = []
            while True:
                batch = consuming.message_receive(
                    group=ConsumerGroup.objects.get(pk=group.pk),
                    topic=topic,
                    max_messages=4,
                    invisible_seconds=60,
                )
                if not batch:
                    return got
                got += [r.message.msg_id for r in batch]

        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(in_own_connection, barrier, consume) for _ in range(2)]
            return [future.result(timeout=120) for future in futures]

    for attempt in (1, 2):
        first, second = race()
        assert len(first) == len(set(first))
        assert len(second) == len(set(second))
        assert not set(first) & set(second), f"attempt {attempt}: handed to both"
        assert set(first) | set(second) == sent, f"attempt {attempt}"
        assert first, f"attempt {attempt}: the other consumer took everything, no race"
        assert second, f"attempt {attempt}: the other consumer took everything, no race"
        assert Delivery.objects.filter(state="INFLIGHT", attempts=attempt).count() == len(sent)
        # Every invisible time passes: all 90 are due for redelivery.
        Delivery.objects.update(invisible_until=timezone.now() - timedelta(seconds=1))


def test_a_claimed_check_whose_transaction_was_resolved_meanwhile_is_skipped(
    transactional_db: None, checker: Any
) -> None:
    """checkback_run on a claim whose transaction the producer resolved after the claim: no HTTP
    call (invariant 7), "skipped", and the lease is cleared. A second claimed transaction, still
    PREPARED, run the same way is checked: the checker is reachable and records."""
    checker.answer("COMMIT")
    topic = registry.topic_create(name="orders", queues=1)
    group = registry.producer_group_create(name="shop", check_url=checker.url)
    resolved, control = prepare(group, topic, "resolved"), prepare(group, topic, "control")
    HalfMessage.objects.filter(pk__in=[resolved.pk, control.pk]).update(
        next_check_at=timezone.now() - timedelta(seconds=1)
    )
    assert sorted(checkback.checkback_claim_due()) == sorted([resolved.pk, control.pk])
    assert HalfMessage.objects.get(pk=resolved.pk).checking_until is not None
    transactions.transaction_rollback(transaction_id=resolved.transaction_id, actor=PRODUCER)

    assert checkback.checkback_run(half_id=resolved.pk) == "skipped"
    assert checker.requests == []
    after = HalfMessage.objects.get(pk=resolved.pk)
    assert (after.state, after.checking_until) == ("ROLLED_BACK", None)
    assert not OpRecord.objects.filter(half=after, op="CHECK").exists()

    assert checkback.checkback_run(half_id=control.pk) == "COMMIT"  # the positive control
    assert [r["body"]["transaction_id"] for r in checker.requests] == [str(control.transaction_id)]
    assert checker.checks_of(str(resolved.transaction_id)) == []
