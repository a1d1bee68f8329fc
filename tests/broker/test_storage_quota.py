"""A producer group's storage quota (TXHUB_PRODUCER_GROUP_STORAGE_QUOTA, docs/decisions/0085): once
the measure finds a group keeping its quota's worth of messages, its sends and prepares are
refused with 403 quota_exceeded and store nothing, at the DRF door and the lean door alike,
while another group keeps sending and the group's pending transactions still resolve; retention
brings its usage down and its sends are taken again."""

import base64
import time
from typing import Any

import pytest
import requests
from rest_framework.test import APIClient

from apps.broker import storage_quota
from apps.broker.services import delivery, registry, retention, storage_usage
from tests.conftest import Server
from tests.support.storage import counted_for_good, measured, no_quota_published, stored_rows

__all__ = ["no_quota_published"]

pytestmark = pytest.mark.usefixtures("no_quota_published")

BODY = "x" * 4000
QUOTA = 10_000


def message(group: str, **extra: Any) -> dict[str, Any]:
    return {"producer_group": group, "body": BODY, **extra}


def refused(answer: Any, group: str) -> None:
    assert answer.status_code == 403, answer.content
    error = answer.json()["error"]
    assert error["code"] == "quota_exceeded", error
    assert error["details"]["producer_group"] == group
    assert error["details"]["stored_bytes"] >= QUOTA


def test_a_group_over_its_quota_is_refused_and_stores_nothing_at_the_drf_door(
    api: APIClient, setup_topic: Any, make_client: Any, settings: Any
) -> None:
    settings.TXHUB_PRODUCER_GROUP_STORAGE_QUOTA = QUOTA
    setup_topic()
    registry.producer_group_create(name="other-service")
    producer = make_client("produce:order-service", "produce:other-service")
    pending = [
        producer.post(
            "/api/v1/transactions", message("order-service", topic="orders"), format="json"
        ).json()["transaction_id"]
        for _ in range(2)
    ]
    answer = producer.post("/api/v1/topics/orders/messages", message("order-service"), "json")
    assert answer.status_code == 201, answer.content
    assert measured() == {"order-service": storage_usage.stored_bytes()["order-service"]}
    assert storage_usage.stored_bytes()["order-service"] >= 3 * len(BODY)
    before = stored_rows()

    refused(producer.post("/api/v1/topics/orders/messages", message("order-service"), "json"),
            "order-service")  # fmt: skip
    delayed = message("order-service", delay_level=3)
    refused(producer.post("/api/v1/topics/orders/messages", delayed, "json"), "order-service")
    prepare = message("order-service", topic="orders")
    refused(producer.post("/api/v1/transactions", prepare, "json"), "order-service")
    batch = {"producer_group": "order-service", "messages": [{"body": "a"}, {"body": "b"}]}
    refused(producer.post("/api/v1/topics/orders/messages:batch", batch, "json"), "order-service")
    prepares = {**batch, "topic": "orders"}
    refused(producer.post("/api/v1/transactions:batch", prepares, "json"), "order-service")
    assert stored_rows() == before

    # Another group keeps sending; the group's pending transactions still resolve.
    other = producer.post("/api/v1/topics/orders/messages", message("other-service"), "json")
    assert other.status_code == 201, other.content
    commit = producer.post(f"/api/v1/transactions/{pending[0]}/commit", {}, "json")
    assert commit.status_code == 200, commit.content
    rollback = producer.post(f"/api/v1/transactions/{pending[1]}/rollback", {}, "json")
    assert rollback.status_code == 200, rollback.content


def test_usage_counts_every_stored_copy_once_and_falls_with_retention(
    transactional_db: None, setup_topic: Any, make_client: Any, settings: Any
) -> None:
    """Rows measured once (recent) and twice (counted for good), deleted before and after their
    second measure: the usage follows what is stored, and the group may send again."""
    settings.TXHUB_PRODUCER_GROUP_STORAGE_QUOTA = QUOTA
    setup_topic()
    producer = make_client("produce:order-service")
    send = "/api/v1/topics/orders/messages"
    for _ in range(2):
        assert producer.post(send, message("order-service"), "json").status_code == 201
    encoded = base64.b64encode(b"\0" * 3000).decode()
    binary = {"producer_group": "order-service", "body_base64": encoded}
    assert producer.post(send, binary, "json").status_code == 201
    measured()
    first = storage_usage.stored_bytes()["order-service"]
    assert 11000 <= first < 11000 + 3 * 64  # bodies, and keys and properties as stored
    assert storage_usage.groups_over_quota() == {"order-service": first}
    measured()  # the same rows, counted for good now
    assert storage_usage.stored_bytes()["order-service"] == first
    refused(producer.post(send, message("order-service"), "json"), "order-service")

    settings.TXHUB_RETENTION = 0  # everything sent is finished (no consumer has a cursor)
    assert retention.retention_sweep()["commit_log"] == 3
    measured()
    assert storage_usage.stored_bytes().get("order-service", 0) == 0
    answer = producer.post(send, message("order-service"), "json")
    assert answer.status_code == 201, answer.content
    measured()  # measured once, deleted, measured again: nothing left of it
    assert retention.retention_sweep()["commit_log"] == 1
    measured()
    assert storage_usage.stored_bytes().get("order-service", 0) == 0


def test_a_group_over_its_quota_is_refused_at_the_lean_door(
    server: Server, setup_topic: Any, settings: Any
) -> None:
    """The web servers read what the measure published (within a second), whatever their own
    settings say; their sends are answered by the lean door."""
    settings.TXHUB_PRODUCER_GROUP_STORAGE_QUOTA = QUOTA
    registry.topic_create(name="orders", queues=4)
    for group in ("order-service", "other-service"):
        registry.producer_group_create(name=group)
    headers = server.token("produce:order-service", "produce:other-service")
    url = server.url("/api/v1/topics/orders/messages")
    for _ in range(3):
        answer = requests.post(url, json=message("order-service"), headers=headers, timeout=10)
        assert answer.status_code == 201, answer.content
    assert "order-service" in measured()
    # Every web process reads the published list again at its first call a second after it
    # last read it (storage_quota.REFRESH_SECONDS).
    time.sleep(storage_quota.REFRESH_SECONDS + 0.2)
    before = stored_rows()
    for _ in range(4):  # each of the two workers, whichever takes the call
        answer = requests.post(url, json=message("order-service"), headers=headers, timeout=10)
        refused(answer, "order-service")
    prepare = server.url("/api/v1/transactions")
    answer = requests.post(prepare, json=message("order-service", topic="orders"),
                           headers=headers, timeout=10)  # fmt: skip
    refused(answer, "order-service")
    assert stored_rows() == before
    other = requests.post(url, json=message("other-service"), headers=headers, timeout=10)
    assert other.status_code == 201, other.content


def test_a_delayed_message_delivered_or_recalled_is_counted_once_where_it_went(
    transactional_db: None, setup_topic: Any, make_client: Any
) -> None:
    """Moved from the delayed table to the commit log (delivered) or to the recalled table: the
    group's usage is the same before and after, never the message twice."""
    setup_topic()
    producer = make_client("produce:order-service")
    send = "/api/v1/topics/orders/messages"
    ids = []
    for _ in range(2):
        answer = producer.post(send, message("order-service", delay_level=1), "json")
        assert answer.status_code == 201, answer.content
        ids.append(answer.json()["msg_id"])
    # Counted for good, so their deletion is what takes them off (decision 0095): two measures
    # alone left them in `recent`, re-summed each measure, and a recall that deleted its row
    # without taking it off went unseen (decision 0111's R09).
    counted_for_good()
    both = storage_usage.stored_bytes()["order-service"]
    assert both >= 2 * len(BODY)
    recall = producer.post(f"/api/v1/messages/{ids[0]}/recall", {}, "json")
    assert recall.status_code == 200, recall.content
    time.sleep(1.1)
    assert delivery.delayed_deliver_due() == 1
    measured()
    assert storage_usage.stored_bytes()["order-service"] == both
    measured()
    assert storage_usage.stored_bytes()["order-service"] == both


def test_a_tag_is_counted_and_a_group_exactly_at_its_quota_is_refused(
    setup_topic: Any, make_client: Any, settings: Any
) -> None:
    """Two messages alike but for a tag of 100 bytes: the tagged group keeps exactly 100 bytes
    more. A group keeping one byte less than its quota sends; keeping exactly its quota, it is
    refused (decision 0085: "at or over")."""
    settings.TXHUB_PRODUCER_GROUP_STORAGE_QUOTA = 10**9
    setup_topic()
    registry.producer_group_create(name="tagged-service")
    producer = make_client("produce:order-service", "produce:tagged-service")
    send = "/api/v1/topics/orders/messages"
    tagged = message("tagged-service", tags="T" * 100)
    for payload in (message("order-service"), tagged):
        answer = producer.post(send, payload, "json")
        assert answer.status_code == 201, answer.content
    measured()
    kept = storage_usage.stored_bytes()
    assert kept["tagged-service"] - kept["order-service"] == 100
    one = kept["tagged-service"]

    settings.TXHUB_PRODUCER_GROUP_STORAGE_QUOTA = one + 1
    assert measured() == {}
    answer = producer.post(send, tagged, "json")
    assert answer.status_code == 201, answer.content

    settings.TXHUB_PRODUCER_GROUP_STORAGE_QUOTA = 2 * one
    assert measured() == {"tagged-service": 2 * one}
    before = stored_rows()
    answer = producer.post(send, tagged, "json")
    assert answer.status_code == 403, answer.content
    error = answer.json()["error"]
    assert error["code"] == "quota_exceeded", error
    assert (error["details"]["stored_bytes"], error["details"]["quota_bytes"]) == (2 * one, 2 * one)
    assert stored_rows() == before
