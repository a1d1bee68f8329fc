"""The values a transaction's resolution and resumption write and answer, at the REST door
(docs/decisions/0111): a delay level's own seconds counted from the commit, a prepare's delivery
time applied from the commit on, the same answer to a repeated commit, the prepare's born_at kept
in the commit log, and a resume that empties the check count and makes the check due at once;
and the prepare service's own check of a delivery time, whoever calls it (decision 0117)."""

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient

from apps.broker.limits import DELAY_LEVEL_SECONDS
from apps.broker.models import CommitLogEntry, DelayedMessage, HalfMessage, OpRecord, Resolver
from apps.broker.services import checkback, registry, transactions
from apps.broker.services.errors import BrokerError
from apps.broker.services.sending import OutgoingMessage
from apps.broker.services.transactions import Actor
from tests.support.responses import assert_error, expect
from tests.support.transactions import result


def prepare(api: APIClient, names: dict[str, Any], **extra: Any) -> dict[str, Any]:
    payload = {"producer_group": names["producer"], "topic": names["topic"], "body": "order"}
    return dict(expect(api.post("/api/v1/transactions", {**payload, **extra}, format="json"), 201))


def resolve(api: APIClient, transaction_id: str, outcome: str, **body: Any) -> Any:
    return api.post(f"/api/v1/transactions/{transaction_id}/{outcome}", body, format="json")


def test_a_delay_level_counts_its_own_seconds_from_the_commit_and_a_repeat_answers_the_same(
    api: APIClient, setup_topic: Any
) -> None:
    """The first and the last level (1 s and 2 h): the delivery time is the commit's instant plus
    exactly the level's seconds, the COMMIT op keeps it, and a repeated commit answers it too."""
    names = setup_topic()
    for level in (1, len(DELAY_LEVEL_SECONDS)):
        tx = prepare(api, names, delay_level=level)
        committed = expect(resolve(api, tx["transaction_id"], "commit"), 200)
        assert committed["queue_offset"] is None
        resolved_at = datetime.fromisoformat(committed["resolved_at"])
        deliver_at = datetime.fromisoformat(committed["deliver_at"])
        assert deliver_at - resolved_at == timedelta(seconds=DELAY_LEVEL_SECONDS[level - 1])
        stored = DelayedMessage.objects.get(transaction_id=tx["transaction_id"])
        assert stored.deliver_at == deliver_at
        # The repeat writes nothing and answers as the first commit did, delivery time included.
        assert expect(resolve(api, tx["transaction_id"], "commit"), 200) == committed
        # The COMMIT op says when the message becomes visible (the commit-log row comes later).
        history = expect(api.get(f"/api/v1/transactions/{tx['transaction_id']}"), 200)["history"]
        [commit_op] = [op for op in history if op["op"] == "COMMIT"]
        assert datetime.fromisoformat(commit_op["detail"]["deliver_at"]) == deliver_at
        assert OpRecord.objects.filter(half__msg_id=tx["msg_id"], op="COMMIT").count() == 1


def test_a_resume_empties_the_check_count_and_the_check_is_due_at_once(
    api: APIClient, setup_topic: Any, settings: Any
) -> None:
    """A transaction parked after its whole check budget: resumed, its count is 0 again and the
    next claim takes it (a count kept would park it after its next check; a check an interval
    away would keep it waiting). Resuming it again, or a resolved one, is refused."""
    settings.TXHUB_CHECK_MAX = 2
    names = setup_topic()
    tx = prepare(api, names)
    half = HalfMessage.objects.get(transaction_id=tx["transaction_id"])
    assert checkback.checkback_apply(half_id=half.pk, result=result("UNKNOWN")) == "unknown"
    assert checkback.checkback_apply(half_id=half.pk, result=result("UNKNOWN")) == "parked"
    parked = expect(api.get(f"/api/v1/transactions/{tx['transaction_id']}"), 200)
    assert (parked["state"], parked["check_times"]) == ("PARKED", 2)
    assert checkback.checkback_claim_due() == []
    resumed = expect(resolve(api, tx["transaction_id"], "resume", reason="callback fixed"), 200)
    assert (resumed["state"], resumed["check_times"]) == ("PREPARED", 0)
    assert resumed["history"][-1]["op"] == "RESUME"
    assert resumed["history"][-1]["reason"] == "callback fixed"
    assert checkback.checkback_claim_due() == [half.pk]
    again = assert_error(resolve(api, tx["transaction_id"], "resume"), 409, "conflict")
    assert again["details"]["state"] == "PREPARED"
    expect(resolve(api, tx["transaction_id"], "rollback"), 200)
    resolved = assert_error(
        resolve(api, tx["transaction_id"], "resume"), 409, "transaction_resolved"
    )
    assert resolved["details"]["state"] == "ROLLED_BACK"


@pytest.mark.django_db(transaction=True)  # outside a transaction: the one-statement commit
def test_a_commit_waits_for_a_delivery_time_still_ahead_and_not_for_one_passed(
    api: APIClient, setup_topic: Any
) -> None:
    """A prepare's `deliver_at` applies from the commit on: an hour ahead, the commit answers it
    and nothing reaches the commit log; a minute past since the prepare, it is visible at once,
    and the one statement's answer is the one a repeat reads back."""
    names = setup_topic()
    now = timezone.now()
    ahead = prepare(api, names, deliver_at=(now + timedelta(hours=1)).isoformat())
    passed = prepare(api, names, deliver_at=(now - timedelta(minutes=1)).isoformat())
    waiting = expect(resolve(api, ahead["transaction_id"], "commit"), 200)
    assert waiting["queue_offset"] is None
    assert datetime.fromisoformat(waiting["deliver_at"]) == now + timedelta(hours=1)
    assert not CommitLogEntry.objects.filter(transaction_id=ahead["transaction_id"]).exists()
    assert DelayedMessage.objects.get().transaction_id == uuid.UUID(ahead["transaction_id"])
    visible = expect(resolve(api, passed["transaction_id"], "commit"), 200)
    assert (visible["queue_offset"], visible["deliver_at"]) == (0, None)
    assert (visible["state"], visible["resolved_by"]) == ("COMMITTED", "PRODUCER")
    assert expect(resolve(api, passed["transaction_id"], "commit"), 200) == visible
    assert CommitLogEntry.objects.get().transaction_id == uuid.UUID(passed["transaction_id"])


@pytest.mark.django_db(transaction=True)  # outside a transaction: the one-statement commit
def test_a_committed_message_is_born_when_it_was_prepared(api: APIClient, setup_topic: Any) -> None:
    """The commit-log row keeps the half's born_at, through the one-statement commit and a batch
    commit alike; the commit's instant is its stored_at."""
    names = setup_topic()
    single, batched = prepare(api, names), prepare(api, names)
    expect(resolve(api, single["transaction_id"], "commit"), 200)
    ids = {"transaction_ids": [batched["transaction_id"]]}
    expect(api.post("/api/v1/transactions:commit", ids, format="json"), 200)
    path = f"/api/v1/consumer-groups/{names['consumer']}/receive"
    got = expect(api.post(path, {"topic": names["topic"]}, format="json"), 200)["messages"]
    born = {m["msg_id"]: (m["born_at"], m["stored_at"]) for m in got}
    for tx in (single, batched):
        born_at, stored_at = born[tx["msg_id"]]
        assert datetime.fromisoformat(born_at) == datetime.fromisoformat(tx["born_at"])
        assert datetime.fromisoformat(stored_at) > datetime.fromisoformat(tx["born_at"])


@pytest.mark.parametrize("deliver_at", ["past TXHUB_MAX_DELAY", "with a message group"])
def test_the_prepare_service_checks_a_delivery_time_whoever_calls_it(
    transactional_db: None, deliver_at: str
) -> None:
    """The rule is the prepare's own (docs/decisions/0117), not only its doors': a time past
    TXHUB_MAX_DELAY, or any time for a message with a message group, is refused by the service
    and nothing is stored; the same prepare an hour ahead is kept."""
    topic = registry.topic_create(name="orders", queues=1)
    group = registry.producer_group_create(name="shop")
    grouped = deliver_at == "with a message group"
    message = OutgoingMessage(
        producer_group="shop",
        body=b"refused",
        body_is_binary=False,
        message_group="order-9527" if grouped else "",
    )
    hour = timezone.now() + timedelta(hours=1)
    too_late = timezone.now() + timedelta(seconds=settings.TXHUB_MAX_DELAY + 3600)
    actor = Actor(Resolver.PRODUCER, "test")
    with pytest.raises(BrokerError) as refused:
        transactions.transaction_prepare(
            producer_group=group,
            topic=topic,
            message=message,
            actor=actor,
            deliver_at=hour if grouped else too_late,
        )
    assert set(refused.value.details) == {"message_group" if grouped else "deliver_at"}
    assert not HalfMessage.objects.exists()
    kept = OutgoingMessage(producer_group="shop", body=b"kept", body_is_binary=False)
    half = transactions.transaction_prepare(
        producer_group=group, topic=topic, message=kept, actor=actor, deliver_at=hour
    )
    assert HalfMessage.objects.get().deliver_at == half.deliver_at == hour
