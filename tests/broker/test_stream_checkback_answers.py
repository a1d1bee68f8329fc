"""A check-back answered over a producer's Telemetry stream (services/checkback_stream.py,
decision 0034): only a producer of the transaction's group may answer it, an answer after the
transaction was resolved is recorded and not applied, and when the process holding the
producer's stream is gone the check goes to the group's check URL."""

import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.utils import timezone

from apps.broker.models import CommitLogEntry, HalfMessage, OpRecord, Resolver
from apps.broker.services import checkback, checkback_stream, clients, registry, transactions
from apps.broker.services.callbacks import CheckResult
from apps.broker.services.errors import NotFound, TransactionResolved
from apps.broker.services.sending import OutgoingMessage
from apps.broker.services.transactions import Actor

CLIENT = "shop-host@101@0@producer"
# The token of CLIENT's stream, as check-back records it (a client is its token's: decision 0100).
TOKEN_ID = 7
# Redis channels are shared by every database and so by every test worker: a name of this run's.
PROCESS = f"grpc-host-{uuid.uuid4().hex[:8]}:4242"
PRODUCER = Actor(Resolver.PRODUCER, "rocketmq")


def prepared(check_url: str = "http://127.0.0.1:9/check") -> HalfMessage:
    group = registry.producer_group_create(name="shop", check_url=check_url)
    registry.producer_group_create(name="other")
    topic = registry.topic_create(name="orders", queues=1)
    message = OutgoingMessage(producer_group="shop", body=b"order 9527", body_is_binary=False)
    return transactions.transaction_prepare(
        producer_group=group, topic=topic, message=message, actor=PRODUCER
    )


def sent_on_the_stream(half: HalfMessage) -> None:
    """What check-back writes when it hands the check to the process holding CLIENT's stream."""
    via = {"via": "telemetry", "client_id": CLIENT, "token_id": TOKEN_ID, "process": PROCESS}
    checkback.checkback_apply(
        half_id=half.pk, result=CheckResult("UNKNOWN", True, None, "", 0, "", via=via)
    )


def answer(half: HalfMessage, state: str, groups: list[str], token_id: int = TOKEN_ID) -> str:
    return checkback_stream.checkback_answer(
        transaction_id=half.transaction_id,
        answer=state,
        client_id=CLIENT,
        token_id=token_id,
        producer=PRODUCER,
        producer_groups=groups,
    )


def test_a_producer_of_another_group_cannot_answer_the_check(db: None) -> None:
    half = prepared()
    sent_on_the_stream(half)
    ops_before = OpRecord.objects.filter(half=half).count()
    with pytest.raises(NotFound):
        answer(half, "COMMIT", ["other"])
    half.refresh_from_db()
    assert half.state == "PREPARED"
    assert OpRecord.objects.filter(half=half).count() == ops_before
    # The positive control: the group's own producer's answer is check-back's resolution.
    assert answer(half, "COMMIT", ["shop"]) == "COMMIT"
    half.refresh_from_db()
    assert (half.state, half.resolved_by) == ("COMMITTED", "CHECK_BACK")


def test_the_same_client_id_of_another_token_does_not_answer_the_check(db: None) -> None:
    half = prepared()
    sent_on_the_stream(half)
    # Another token's client of the same id is another client (decision 0100): its server-check
    # answer is a producer's own resolution, not check-back's.
    assert answer(half, "ROLLBACK", ["shop"], token_id=TOKEN_ID + 1) == "producer"
    half.refresh_from_db()
    assert (half.state, half.resolved_by) == ("ROLLED_BACK", "PRODUCER")


def test_an_answer_after_the_producer_resolved_is_recorded_and_not_applied(db: None) -> None:
    half = prepared()
    sent_on_the_stream(half)
    transactions.transaction_commit(
        transaction_id=half.transaction_id, actor=PRODUCER, producer_groups=["shop"]
    )
    assert answer(half, "ROLLBACK", ["shop"]) == "resolved-meanwhile"
    half.refresh_from_db()
    assert (half.state, half.resolved_by) == ("COMMITTED", "PRODUCER")
    last = OpRecord.objects.filter(half=half, op="CHECK").latest("id")
    assert (last.detail["answer"], last.detail["applied"]) == ("ROLLBACK", False)
    assert OpRecord.objects.filter(half=half, op__in=["COMMIT", "ROLLBACK"]).count() == 1


def make_due(half: HalfMessage) -> None:
    HalfMessage.objects.filter(pk=half.pk).update(
        next_check_at=timezone.now() - timedelta(seconds=1), checking_until=None
    )
    assert checkback.checkback_claim_due() == [half.pk]


def test_when_the_process_holding_the_stream_is_gone_the_check_goes_to_the_check_url(
    db: None, checker: Any, settings: Any
) -> None:
    checker.answer("COMMIT")
    half = prepared(checker.url)
    token, _ = registry.token_create(name="rocketmq", scopes=["produce:shop"])
    clients.client_seen(client_id=CLIENT, token_id=token.pk, client_type="PRODUCER", group="shop")
    clients.client_stream_opened(client_id=CLIENT, token_id=token.pk, process=PROCESS)
    # The positive control: while the process holding the stream listens, the check is sent
    # there, and the check URL is not called.
    listener = redis.Redis.from_url(settings.CELERY_BROKER_URL).pubsub()  # type: ignore[no-untyped-call]
    listener.subscribe(checkback_stream.CHANNEL_PREFIX + PROCESS)
    try:
        make_due(half)
        assert checkback.checkback_run(half_id=half.pk) == "unknown"
        note = None
        while note is None or note["type"] != "message":
            note = listener.get_message(timeout=5)
            assert note is not None, "nothing was published to the stream's process"
        assert json.loads(note["data"])["transaction_id"] == str(half.transaction_id)
        assert checker.checks_of(str(half.transaction_id)) == []
    finally:
        listener.close()
    # That process is gone (nobody listens): the next check goes to the check URL.
    make_due(half)
    assert checkback.checkback_run(half_id=half.pk) == "COMMIT"
    assert len(checker.checks_of(str(half.transaction_id))) == 1
    half.refresh_from_db()
    assert (half.state, half.resolved_by) == ("COMMITTED", "CHECK_BACK")
    last = OpRecord.objects.filter(half=half, op="CHECK").latest("id")
    assert last.detail.get("via") != "telemetry"


def test_the_answer_to_the_last_check_the_budget_allows_is_applied(db: None, settings: Any) -> None:
    """A stream check is counted when it is sent, so the last one the budget allows parks the
    transaction before the producer can answer it. A PARKED transaction is still unresolved
    (CONTRACT sections 1 and 4): the producer's answer to that check decides it."""
    settings.TXHUB_CHECK_MAX = 1
    half = prepared()
    token, _ = registry.token_create(name="rocketmq", scopes=["produce:shop"])
    clients.client_seen(client_id=CLIENT, token_id=token.pk, client_type="PRODUCER", group="shop")
    clients.client_stream_opened(client_id=CLIENT, token_id=token.pk, process=PROCESS)
    listener = redis.Redis.from_url(settings.CELERY_BROKER_URL).pubsub()  # type: ignore[no-untyped-call]
    listener.subscribe(checkback_stream.CHANNEL_PREFIX + PROCESS)
    try:
        make_due(half)
        assert checkback.checkback_run(half_id=half.pk) == "parked"
        note = None
        while note is None or note["type"] != "message":
            note = listener.get_message(timeout=5)
            assert note is not None, "no check was published to the stream's process"
        assert json.loads(note["data"])["transaction_id"] == str(half.transaction_id)
    finally:
        listener.close()
    half.refresh_from_db()
    assert half.state == "PARKED"
    assert answer(half, "COMMIT", ["shop"], token_id=token.pk) == "COMMIT"
    half.refresh_from_db()
    assert (half.state, half.resolved_by) == ("COMMITTED", "CHECK_BACK")
    finals = OpRecord.objects.filter(half=half, op__in=["COMMIT", "ROLLBACK"])
    assert list(finals.values_list("op", "source")) == [("COMMIT", "CHECK_BACK")]
    last = OpRecord.objects.filter(half=half, op="CHECK").latest("id")
    assert (last.detail["answer"], last.detail["applied"]) == ("COMMIT", True)
    assert CommitLogEntry.objects.filter(transaction_id=half.transaction_id).count() == 1


def test_a_check_goes_to_the_next_producer_when_the_first_ones_process_is_gone(
    db: None, settings: Any
) -> None:
    """Every connected producer of the group may settle the check (decision 0023): when the
    process holding the first one's stream is gone, the check goes to the next one's, not to
    the check URL."""
    half = prepared()
    token, _ = registry.token_create(name="rocketmq", scopes=["produce:shop"])
    live, gone = "live-host@1@0@producer", "gone-host@2@0@producer"
    gone_process = f"grpc-gone-{uuid.uuid4().hex[:8]}:4242"
    # The producer seen last is asked first: the one whose process no longer listens.
    for client, process in ((live, PROCESS), (gone, gone_process)):
        clients.client_seen(
            client_id=client, token_id=token.pk, client_type="PRODUCER", group="shop"
        )
        clients.client_stream_opened(client_id=client, token_id=token.pk, process=process)
    listener = redis.Redis.from_url(settings.CELERY_BROKER_URL).pubsub()  # type: ignore[no-untyped-call]
    listener.subscribe(checkback_stream.CHANNEL_PREFIX + PROCESS)
    try:
        assert listener.get_message(timeout=5)["type"] == "subscribe"
        make_due(half)
        assert checkback.checkback_run(half_id=half.pk) == "unknown"
        note = listener.get_message(timeout=5)
        assert note is not None, "the check was not published to the live producer's process"
        assert json.loads(note["data"])["client_id"] == live
    finally:
        listener.close()
    [sent] = OpRecord.objects.filter(half=half, op="CHECK")
    assert (sent.detail["via"], sent.detail["client_id"]) == ("telemetry", live)
    assert sent.detail["process"] == PROCESS


def sent_to(half: HalfMessage, client_id: str) -> None:
    """A check of `half` sent on the stream of TOKEN_ID's client `client_id`."""
    via = {"via": "telemetry", "client_id": client_id, "token_id": TOKEN_ID, "process": PROCESS}
    checkback.checkback_apply(
        half_id=half.pk, result=CheckResult("UNKNOWN", True, None, "", 0, "", via=via)
    )


def test_another_client_of_the_same_token_does_not_answer_the_check(db: None) -> None:
    """The check was sent to one instance: another instance's server-check answer is that
    producer's own resolution (decision 0034)."""
    half = prepared()
    sent_to(half, "another-host@2@0@producer")
    assert answer(half, "ROLLBACK", ["shop"]) == "producer"
    half.refresh_from_db()
    assert (half.state, half.resolved_by) == ("ROLLED_BACK", "PRODUCER")
    assert OpRecord.objects.filter(half=half, op="CHECK").count() == 1  # the one sent


def test_only_the_last_check_sent_is_answered_by_check_back(db: None) -> None:
    half = prepared()
    sent_to(half, CLIENT)
    sent_to(half, "another-host@2@0@producer")  # the next check went to another instance
    assert answer(half, "COMMIT", ["shop"]) == "producer"
    half.refresh_from_db()
    assert (half.state, half.resolved_by) == ("COMMITTED", "PRODUCER")
    assert OpRecord.objects.filter(half=half, op="CHECK").count() == 2


def test_a_second_answer_to_one_check_is_the_producers_own(db: None) -> None:
    """An answered check is no longer outstanding: a repeat is the producer's own repeat (the
    same answer, nothing recorded), and the opposite answer is refused (CONTRACT invariant 2)."""
    half = prepared()
    sent_on_the_stream(half)
    assert answer(half, "COMMIT", ["shop"]) == "COMMIT"
    assert answer(half, "COMMIT", ["shop"]) == "producer"
    with pytest.raises(TransactionResolved):
        answer(half, "ROLLBACK", ["shop"])
    half.refresh_from_db()
    assert (half.state, half.resolved_by) == ("COMMITTED", "CHECK_BACK")
    checks = OpRecord.objects.filter(half=half, op="CHECK").order_by("id")
    assert [c.detail.get("applied") for c in checks] == [False, True]  # sent, then answered
    assert OpRecord.objects.filter(half=half, op__in=["COMMIT", "ROLLBACK"]).count() == 1
