"""The SDK's Idempotency-Key is one per call, its retries honour 429/503 and Retry-After within a
time budget, and a commit refused because the transaction was resolved the other way returns
that resolution (docs/decisions/0082). Against real gunicorns on the test database."""

import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from django.conf import settings
from django.core.cache import caches
from txhub_client import (
    LocalTransactionState,
    Message,
    Producer,
    SimpleConsumer,
    TransactionProducer,
    TxhubError,
)

from apps.broker.api.throttling import TokenRateThrottle
from apps.broker.models import CommitLogEntry, HalfMessage
from apps.broker.services import registry
from tests.conftest import start_gunicorn
from tests.support.ports import free_port
from tests.support.sdk import Listener
from tests.support.throttling import fresh_budget

RATE = 2  # per second: a window of one second, so Retry-After is 1


def test_the_same_message_object_sent_twice_is_stored_twice(shop: dict[str, Any]) -> None:
    producer = Producer(shop["url"], shop["token"], "shop")
    message = Message("orders", "order 9530 created")
    first = producer.send(message)
    second = producer.send(message)
    assert first.msg_id != second.msg_id
    assert message.idempotency_key is None  # the call's own key is never written back
    message.body = "order 9530 changed"  # a changed body is a new message, not a 409
    third = producer.send(message)
    stored = CommitLogEntry.objects.filter(body__in=[b"order 9530 created", b"order 9530 changed"])
    assert sorted(row.msg_id for row in stored) == sorted(
        [first.msg_id, second.msg_id, third.msg_id]
    )

    committing = TransactionProducer(
        shop["url"],
        shop["token"],
        "shop",
        Listener(lambda m, a: LocalTransactionState.COMMIT_MESSAGE),
    )
    again = Message("orders", "order 9531 created")
    one = committing.send_message_in_transaction(again)
    two = committing.send_message_in_transaction(again)
    assert one.transaction_id != two.transaction_id
    assert (one.state, two.state) == ("COMMITTED", "COMMITTED")
    assert HalfMessage.objects.filter(body=b"order 9531 created").count() == 2


def test_an_explicit_idempotency_key_still_stores_once(shop: dict[str, Any]) -> None:
    """The positive control: a key the caller chose deduplicates across sends."""
    producer = Producer(shop["url"], shop["token"], "shop")
    first = producer.send(Message("orders", "order 9532", idempotency_key="order-9532-created"))
    second = producer.send(Message("orders", "order 9532", idempotency_key="order-9532-created"))
    assert first == second
    assert CommitLogEntry.objects.filter(body=b"order 9532").count() == 1
    with pytest.raises(TxhubError) as changed:
        producer.send(Message("orders", "order 9532 v2", idempotency_key="order-9532-created"))
    assert (changed.value.status, changed.value.code) == (409, "conflict")


def test_a_commit_refused_as_already_rolled_back_returns_the_real_state(
    shop: dict[str, Any],
) -> None:
    """Check-back (here: a rollback through the API meanwhile) ended the transaction before the
    producer's commit: the result says ROLLED_BACK and that it diverged, not PREPARED."""
    headers = {"Authorization": f"Bearer {shop['token']}"}

    def rolled_back_meanwhile(message: Message, arg: Any) -> LocalTransactionState:
        url = f"{shop['url']}/api/v1/transactions/{message.transaction_id}/rollback"
        assert requests.post(url, headers=headers, timeout=30).status_code == 200
        return LocalTransactionState.COMMIT_MESSAGE

    producer = TransactionProducer(
        shop["url"], shop["token"], "shop", Listener(rolled_back_meanwhile)
    )
    result = producer.send_message_in_transaction(Message("orders", "order 9533 created"))
    assert result.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE
    assert result.state == "ROLLED_BACK"
    assert result.diverged
    assert isinstance(result.error, TxhubError)
    assert (result.error.status, result.error.code) == (409, "transaction_resolved")
    assert HalfMessage.objects.get(body=b"order 9533 created").state == "ROLLED_BACK"

    plain = TransactionProducer(
        shop["url"], shop["token"], "shop", Listener(lambda m, a: LocalTransactionState.UNKNOW)
    ).send_message_in_transaction(Message("orders", "order 9534 created"))
    assert (plain.state, plain.diverged) == ("PREPARED", False)


@pytest.fixture
def throttled(shop: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A second real gunicorn on the same database, limited to RATE requests per second per
    token, and a fresh token of the producer group "shop" (and consumer group "billing")."""
    created, raw = registry.token_create(
        name="throttled", scopes=["produce:shop", "consume:billing"]
    )
    fresh_budget(created.pk, 1)
    port = free_port()
    process = start_gunicorn(
        port, workers=1, threads=2, extra_env={"TXHUB_THROTTLE_RATE": f"{RATE}/s"}
    )
    try:
        yield {"url": f"http://127.0.0.1:{port}", "token": raw, "id": created.pk}
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def spend_the_budget(throttled: dict[str, Any]) -> tuple[float, int]:
    """Sends until the server answers 429 early in a one-second window, so the next call lands in
    the same window; returns its Retry-After and the window."""
    url = throttled["url"] + "/api/v1/topics/orders/messages"
    headers = {"Authorization": f"Bearer {throttled['token']}"}
    for _ in range(10):
        time.sleep(1 - time.time() % 1)  # a window's start
        for _ in range(RATE + 1):
            answer = requests.post(
                url, json={"producer_group": "shop", "body": "spent"}, headers=headers, timeout=30
            )
        now = time.time()
        if answer.status_code == 429 and now % 1 < 0.6:
            return float(answer.headers["Retry-After"]), int(now)
    raise AssertionError("never throttled early in a window")


def counted(token_id: int, window: int) -> int:
    """The requests the server counted for the token in a one-second window."""
    key = TokenRateThrottle.cache_format % {
        "scope": TokenRateThrottle.scope,
        "ident": token_id,
        "window": window,
    }
    return int(caches[settings.TXHUB_THROTTLE_CACHE].get(key, 0))


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_a_429_is_retried_after_its_retry_after_and_stored_once(
    throttled: dict[str, Any],
) -> None:
    producer = Producer(throttled["url"], throttled["token"], "shop")
    retry_after, window = spend_the_budget(throttled)
    start = time.monotonic()
    sent = producer.send(Message("orders", "order 9535 created"))
    assert time.monotonic() - start >= retry_after  # waited what it was told, not 0.2 s
    # The server counted one attempt of the SDK in the throttled window (a retry after 0.2 s
    # and 0.6 s would land there too), the budget's RATE and the 429 before it.
    assert counted(throttled["id"], window) == RATE + 2
    assert [r.msg_id for r in CommitLogEntry.objects.filter(body=b"order 9535 created")] == [
        sent.msg_id
    ]

    # A Retry-After past the budget is not waited out, and a receive (not repeatable) is never
    # retried: both raise the 429 at once.
    impatient = Producer(throttled["url"], throttled["token"], "shop", retry_budget=0.5)
    consumer = SimpleConsumer(throttled["url"], throttled["token"], "billing", topic="orders")
    for call in (
        lambda: impatient.send(Message("orders", "order 9536 created")),
        lambda: consumer.receive(),
    ):
        _, window = spend_the_budget(throttled)
        start = time.monotonic()
        with pytest.raises(TxhubError) as refused:
            call()
        assert time.monotonic() - start < 0.5
        assert (refused.value.status, refused.value.retry_after) == (429, retry_after)
        assert counted(throttled["id"], window) == RATE + 2
    assert not CommitLogEntry.objects.filter(body=b"order 9536 created").exists()
