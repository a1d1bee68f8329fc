"""The Python SDK's Producer.recall (docs/decisions/0055) against the real server (gunicorn)."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from txhub_client import Message, Producer, RecallResult, TxhubError

from apps.broker.models import DelayedMessage, RecalledMessage


def test_the_sdk_recalls_a_delayed_message_and_is_told_409_for_a_delivered_one(
    shop: dict[str, Any],
) -> None:
    producer = Producer(shop["url"], shop["token"], "shop")
    later = datetime.now(UTC) + timedelta(hours=1)
    sent = producer.send(Message(topic="orders", body="order 9527", deliver_at=later))
    recalled = producer.recall(sent.msg_id)
    assert isinstance(recalled, RecallResult)
    assert (recalled.msg_id, recalled.topic, recalled.door) == (sent.msg_id, "orders", "rest")
    assert recalled.recalled_by == "http-test"
    assert producer.recall(sent.msg_id) == recalled  # a repeat answers the first recall
    assert not DelayedMessage.objects.exists()
    assert RecalledMessage.objects.get().msg_id == sent.msg_id

    delivered = producer.send(Message(topic="orders", body="at once"))
    with pytest.raises(TxhubError) as refused:
        producer.recall(delivered.msg_id)
    assert (refused.value.status, refused.value.code) == (409, "conflict")
    with pytest.raises(TxhubError) as unknown:
        producer.recall("0" * 32)
    assert (unknown.value.status, unknown.value.code) == (404, "not_found")
