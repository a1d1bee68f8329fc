"""Recalling a delayed message (RocketMQ 5.3's RecallMessage, docs/decisions/0055) over real HTTP
against gunicorn: a recalled message is never delivered, a delivered one is 409, another
tenant's is 404 as an unknown one, and a hostile id in the URL stores nothing."""

from datetime import datetime, timedelta
from typing import Any

import pytest
import requests

from apps.broker.clock import db_now
from apps.broker.models import CommitLogEntry, DelayedMessage, RecalledMessage
from apps.broker.services import delivery
from tests.conftest import Server
from tests.support.responses import assert_error, expect
from tests.support.waiting import wait_until


class Shop:
    """On the real server: topic "orders", producer group "shop", consumer group "billing"."""

    def __init__(self, server: Server) -> None:
        self.server = server
        admin = server.token("admin")
        expect(self.post(admin, "/api/v1/topics", {"name": "orders", "queues": 2}), 201)
        for group in ("shop", "other"):
            body = {"name": group, "check_url": "http://127.0.0.1:9/"}
            expect(self.post(admin, "/api/v1/producer-groups", body), 201)
        expect(self.post(admin, "/api/v1/consumer-groups", {"name": "billing"}), 201)
        self.producer = server.token("produce:shop")

    def post(
        self, headers: dict[str, str], path: str, payload: dict[str, Any] | None = None
    ) -> requests.Response:
        return requests.post(self.server.url(path), json=payload, headers=headers, timeout=30)

    def send(self, *, in_seconds: float | None = 1.0, body: str = "order") -> dict[str, Any]:
        payload: dict[str, Any] = {"producer_group": "shop", "body": body}
        if in_seconds is not None:
            payload["deliver_at"] = (db_now() + timedelta(seconds=in_seconds)).isoformat()
        return dict(
            expect(self.post(self.producer, "/api/v1/topics/orders/messages", payload), 201)
        )

    def recall(self, msg_id: str, headers: dict[str, str] | None = None) -> requests.Response:
        who = self.producer if headers is None else headers
        return self.post(who, f"/api/v1/messages/{msg_id}/recall")

    def trace(self, msg_id: str) -> dict[str, Any]:
        path = self.server.url(f"/api/v1/messages/{msg_id}")
        return dict(expect(requests.get(path, headers=self.producer, timeout=30), 200))

    def received(self) -> list[str]:
        consumer = self.server.token("consume:billing")
        path = "/api/v1/consumer-groups/billing/receive"
        answer = expect(self.post(consumer, path, {"topic": "orders", "max_messages": 32}), 200)
        return [m["msg_id"] for m in answer["messages"]]


@pytest.fixture
def shop(server: Server) -> Shop:
    return Shop(server)


def deliver_when_due(*msg_ids: str) -> int:
    """Waits until the messages are due (database clock), then runs the delayed delivery."""
    due = max(DelayedMessage.objects.get(msg_id=m).deliver_at for m in msg_ids)
    wait_until(lambda: db_now() > due, timeout=30, interval=0.05)
    return delivery.delayed_deliver_due()


def test_a_recalled_message_is_never_delivered(shop: Shop) -> None:
    recalled, kept = shop.send(), shop.send()
    answer = expect(shop.recall(recalled["msg_id"]), 200)
    assert answer["msg_id"] == recalled["msg_id"]
    assert (answer["topic"], answer["producer_group"]) == ("orders", "shop")
    assert (answer["recalled_by"], answer["door"], answer["transaction_id"]) == (
        "http-test",
        "rest",
        None,
    )
    assert datetime.fromisoformat(answer["deliver_at"]) == datetime.fromisoformat(
        recalled["deliver_at"]
    )
    # Recalled again: the first recall's answer, nothing changed (decision 0055).
    assert expect(shop.recall(recalled["msg_id"]), 200) == answer

    # The delivery runs: the message not recalled is delivered, the recalled one never.
    assert deliver_when_due(kept["msg_id"]) == 1
    assert delivery.delayed_deliver_due() == 0
    assert list(CommitLogEntry.objects.values_list("msg_id", flat=True)) == [kept["msg_id"]]
    assert shop.received() == [kept["msg_id"]]

    # Its history says when, by whom, through which door.
    trace = shop.trace(recalled["msg_id"])
    assert trace["recall"] == {
        "recalled_at": answer["recalled_at"],
        "recalled_by": "http-test",
        "door": "rest",
        "deliver_at": answer["deliver_at"],
    }
    assert (trace["commit_log"], trace["delayed_until"], trace["body"]) == (None, None, "order")


def test_a_committed_delayed_transaction_is_recalled_and_a_prepared_one_is_not(
    shop: Shop,
) -> None:
    def prepare() -> dict[str, Any]:
        body = {"producer_group": "shop", "topic": "orders", "body": "tx", "delay_level": 1}
        return dict(expect(shop.post(shop.producer, "/api/v1/transactions", body), 201))

    committed, prepared = prepare(), prepare()
    commit = f"/api/v1/transactions/{committed['transaction_id']}/commit"
    expect(shop.post(shop.producer, commit, {}), 200)

    answer = expect(shop.recall(committed["msg_id"]), 200)
    assert answer["transaction_id"] == committed["transaction_id"]
    refused = assert_error(shop.recall(prepared["msg_id"]), 409, "conflict")
    assert refused["details"] == {"state": "PREPARED"}

    assert delivery.delayed_deliver_due() == 0
    assert not CommitLogEntry.objects.exists()
    trace = shop.trace(committed["msg_id"])
    assert trace["transaction"]["state"] == "COMMITTED"
    assert trace["recall"]["door"] == "rest"


def test_a_delivered_message_is_409(shop: Shop) -> None:
    delayed, plain = shop.send(), shop.send(in_seconds=None)
    assert deliver_when_due(delayed["msg_id"]) == 1
    for sent in (delayed, plain):
        error = assert_error(shop.recall(sent["msg_id"]), 409, "conflict")
        assert error["details"] == {"state": "DELIVERED"}
    assert not RecalledMessage.objects.exists()
    assert sorted(shop.received()) == sorted([delayed["msg_id"], plain["msg_id"]])


def test_an_unknown_message_and_another_tenants_are_the_same_404(shop: Shop) -> None:
    sent = shop.send(in_seconds=60)
    other = shop.server.token("produce:other")
    theirs = assert_error(shop.recall(sent["msg_id"], other), 404, "not_found")
    unknown = assert_error(shop.recall("0" * 32, other), 404, "not_found")
    # Nothing tells the other tenant that the message exists.
    assert theirs["message"].replace(sent["msg_id"], "<id>") == unknown["message"].replace(
        "0" * 32, "<id>"
    )
    assert theirs["details"] == unknown["details"] == {}
    assert_error(shop.recall("0" * 32), 404, "not_found")
    assert DelayedMessage.objects.filter(msg_id=sent["msg_id"]).exists()
    assert not RecalledMessage.objects.exists()


def test_another_tenants_recalled_delivered_or_prepared_message_is_the_same_404(
    shop: Shop,
) -> None:
    """Whatever became of the message, the other tenant's answer is the unknown id's (decision
    0111); the owner's own answers (200, 409, 409) are the positive control."""
    recalled, delivered = shop.send(in_seconds=60), shop.send(in_seconds=None)
    expect(shop.recall(recalled["msg_id"]), 200)
    body = {"producer_group": "shop", "topic": "orders", "body": "tx"}
    prepared = expect(shop.post(shop.producer, "/api/v1/transactions", body), 201)
    other = shop.server.token("produce:other")
    unknown = assert_error(shop.recall("0" * 32, other), 404, "not_found")
    for sent, own_status in ((recalled, 200), (delivered, 409), (prepared, 409)):
        theirs = assert_error(shop.recall(sent["msg_id"], other), 404, "not_found")
        assert theirs["message"].replace(sent["msg_id"], "0" * 32) == unknown["message"]
        assert theirs["details"] == {}
        assert shop.recall(sent["msg_id"]).status_code == own_status
    assert list(RecalledMessage.objects.values_list("msg_id", flat=True)) == [recalled["msg_id"]]


def test_a_token_without_a_produce_scope_is_refused(shop: Shop) -> None:
    sent = shop.send(in_seconds=60)
    consumer = shop.server.token("consume:billing")
    assert_error(shop.recall(sent["msg_id"], consumer), 403, "forbidden")
    assert_error(shop.recall(sent["msg_id"], {}), 401, "unauthenticated")
    assert DelayedMessage.objects.filter(msg_id=sent["msg_id"]).exists()
    assert not RecalledMessage.objects.exists()


HOSTILE = [
    "%00",
    "A%00B",
    "A" * 65,
    "%C3%A9t%C3%A9",
    "%ED%A0%80",  # a lone surrogate, UTF-8 encoded
    "..%2F..%2Ftopics",
    "1%20OR%201%3D1",
    "x'%3B--",
    "%0A",
]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_hostile_message_id_in_the_url_stores_nothing(shop: Shop, hostile: str) -> None:
    sent = shop.send(in_seconds=60)
    response = shop.recall(hostile)
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:200])
    assert response.headers["Content-Type"] == "application/json"
    assert set(response.json()) == {"error"}
    assert not RecalledMessage.objects.exists()
    assert DelayedMessage.objects.filter(msg_id=sent["msg_id"]).exists()
