"""The SDK sends an Idempotency-Key and retries when an answer is lost: a real proxy between the
SDK and a real gunicorn swallows the answer after txhub stored the message."""

from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from txhub_client import LocalTransactionState, Message, Producer, TransactionProducer

from apps.broker.models import CommitLogEntry, HalfMessage, OpKind, OpRecord
from tests.faultproxy import FaultProxy
from tests.support.sdk import Listener


@pytest.fixture
def proxy(shop: dict[str, Any]) -> Any:
    parts = urlsplit(shop["url"])
    fault = FaultProxy((parts.hostname or "127.0.0.1", parts.port or 80))
    yield fault
    fault.close()


def test_a_lost_send_answer_is_retried_and_stored_once(shop: Any, proxy: FaultProxy) -> None:
    producer = Producer(proxy.url, shop["token"], "shop")
    proxy.drop_answers = 1
    sent = producer.send(Message("orders", "order 9527 created"))
    assert proxy.dropped == 1
    stored = CommitLogEntry.objects.filter(body=b"order 9527 created")
    assert [row.msg_id for row in stored] == [sent.msg_id]


def test_without_retries_the_lost_answer_is_an_error_although_stored(
    shop: Any,
    proxy: FaultProxy,
) -> None:
    """The control: the proxy really loses an answer after the store."""
    producer = Producer(proxy.url, shop["token"], "shop", retries=0)
    proxy.drop_answers = 1
    with pytest.raises(requests.ConnectionError):
        producer.send(Message("orders", "order 9528 created"))
    assert proxy.dropped == 1
    assert CommitLogEntry.objects.filter(body=b"order 9528 created").count() == 1


def test_lost_prepare_and_commit_answers_end_in_one_committed_transaction(
    shop: Any,
    proxy: FaultProxy,
) -> None:
    def local(message: Message, arg: Any) -> LocalTransactionState:
        proxy.drop_answers = 1  # the commit's answer is lost too
        return LocalTransactionState.COMMIT_MESSAGE

    producer = TransactionProducer(proxy.url, shop["token"], "shop", Listener(local))
    proxy.drop_answers = 1
    result = producer.send_message_in_transaction(Message("orders", "order 9529 created"))
    assert proxy.dropped == 2
    assert result.error is None
    assert result.state == "COMMITTED"
    halves = HalfMessage.objects.filter(body=b"order 9529 created")
    assert [str(h.transaction_id) for h in halves] == [result.transaction_id]
    assert OpRecord.objects.filter(half__in=halves, op=OpKind.COMMIT).count() == 1
    assert CommitLogEntry.objects.filter(body=b"order 9529 created").count() == 1
