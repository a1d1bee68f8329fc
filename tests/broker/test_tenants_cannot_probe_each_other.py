"""Tenant A's token learns nothing of tenant B's objects (docs/decisions/0046, 0090): each of B's
groups, transactions, messages and receipt handles answers A exactly as a name or id that does
not exist would, and a group bound to topics gets one answer whether a topic exists or not. The
positive control: B's own token sees and uses them."""

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

NO_SUCH_TRANSACTION = "00000000-0000-4000-8000-000000000000"
NO_SUCH_MESSAGE = "0" * 32


@pytest.fixture
def tenants(
    api: APIClient, make_client: Callable[..., APIClient], setup_topic: Callable[..., Any]
) -> dict[str, Any]:
    setup_topic(topic="a-orders", producer="a-shop", consumer="a-billing")
    setup_topic(topic="b-orders", producer="b-shop", consumer="b-billing")
    for kind, group in (("producer", "a-shop"), ("consumer", "a-billing")):
        topics = {"topics": ["a-orders"]}
        bound = api.put(f"/api/v1/{kind}-groups/{group}/topics", topics, format="json")
        assert bound.status_code == 200
    a = make_client("produce:a-shop", "consume:a-billing", name="tenant-a")
    b = make_client("produce:b-shop", "consume:b-billing", name="tenant-b")
    prepared = b.post(
        "/api/v1/transactions",
        {"producer_group": "b-shop", "topic": "b-orders", "body": "b's half"},
        format="json",
    )
    sent = b.post(
        "/api/v1/topics/b-orders/messages",
        {"producer_group": "b-shop", "body": "b's secret", "delay_level": 18},
        format="json",
    )
    assert prepared.status_code == sent.status_code == 201
    return {
        "a": a,
        "b": b,
        "transaction": prepared.json()["transaction_id"],
        "message": sent.json()["msg_id"],
    }


def answer(response: Any, *names: str) -> tuple[int, str, str]:
    """Status, error code and message, with the names that differ by design made alike."""
    error = response.json()["error"]
    message = error["message"]
    for name in names:
        message = message.replace(name, "<name>")
    return response.status_code, error["code"], message


def test_b_s_transactions_and_messages_answer_a_as_ids_that_do_not_exist(
    tenants: dict[str, Any],
) -> None:
    a, b = tenants["a"], tenants["b"]
    transaction, message = tenants["transaction"], tenants["message"]
    for path in ("/api/v1/transactions/{}", "/api/v1/transactions/{}/commit"):
        method = a.get if path.endswith("}") else a.post
        theirs = method(path.format(transaction))
        none = method(path.format(NO_SUCH_TRANSACTION))
        assert theirs.status_code == 404
        assert answer(theirs, transaction) == answer(none, NO_SUCH_TRANSACTION)
    for path in ("/api/v1/messages/{}", "/api/v1/messages/{}/recall"):
        method = a.get if path.endswith("}") else a.post
        theirs = method(path.format(message))
        none = method(path.format(NO_SUCH_MESSAGE))
        assert theirs.status_code == 404
        assert answer(theirs, message) == answer(none, NO_SUCH_MESSAGE)
    assert a.get("/api/v1/transactions").json()["results"] == []
    # The positive control: B sees and resolves its own.
    assert b.get(f"/api/v1/transactions/{transaction}").status_code == 200
    assert b.get(f"/api/v1/messages/{message}").status_code == 200
    assert b.post(f"/api/v1/transactions/{transaction}/commit").status_code == 200


def test_b_s_groups_and_a_bound_groups_topics_answer_a_alike_whether_they_exist(
    tenants: dict[str, Any],
) -> None:
    a, b = tenants["a"], tenants["b"]
    for path in ("/api/v1/consumer-groups/{}", "/api/v1/consumer-groups/{}/dlq"):
        theirs, none = a.get(path.format("b-billing")), a.get(path.format("no-such-group"))
        assert theirs.status_code == 403
        assert answer(theirs, "b-billing") == answer(none, "no-such-group")
    receive = "/api/v1/consumer-groups/{}/receive"
    theirs = a.post(receive.format("b-billing"), {"topic": "b-orders"}, format="json")
    none = a.post(receive.format("no-such-group"), {"topic": "b-orders"}, format="json")
    assert answer(theirs, "b-billing") == answer(none, "no-such-group")
    send = {"producer_group": "b-shop", "body": "x"}
    theirs = a.post("/api/v1/topics/a-orders/messages", send, format="json")
    other = {**send, "producer_group": "no-such"}
    none = a.post("/api/v1/topics/a-orders/messages", other, format="json")
    assert answer(theirs, "b-shop") == answer(none, "no-such")
    # A's bound groups: B's topic and a topic that does not exist get the same 403.
    for topic in ("b-orders", "no-such-topic"):
        sent = a.post(
            f"/api/v1/topics/{topic}/messages",
            {"producer_group": "a-shop", "body": "x"},
            format="json",
        )
        received = a.post(receive.format("a-billing"), {"topic": topic}, format="json")
        assert answer(sent, topic)[:2] == answer(received, topic)[:2] == (403, "forbidden")
    # The positive control: B uses its own group.
    assert b.get("/api/v1/consumer-groups/b-billing").status_code == 200


def test_b_s_receipt_handle_acks_nothing_for_a(
    tenants: dict[str, Any], make_client: Callable[..., APIClient], api: APIClient
) -> None:
    b = tenants["b"]
    audit = api.post("/api/v1/consumer-groups", {"name": "a-audit"}, format="json")
    assert audit.status_code == 201
    a = make_client("consume:a-audit", name="tenant-a-audit")  # unbound: may read b-orders
    now = {"producer_group": "b-shop", "body": "now"}
    assert b.post("/api/v1/topics/b-orders/messages", now, format="json").status_code == 201
    got = b.post("/api/v1/consumer-groups/b-billing/receive", {"topic": "b-orders"}, format="json")
    handle = got.json()["messages"][0]["receipt_handle"]
    acks = a.post(
        "/api/v1/consumer-groups/a-audit/ack", {"receipt_handles": [handle]}, format="json"
    )
    assert acks.json() == {"acked": [], "invalid": [handle]}
    change = {"receipt_handle": handle, "invisible_seconds": 60}
    changed = a.post("/api/v1/consumer-groups/a-audit/change-invisible", change, format="json")
    none = a.post(
        "/api/v1/consumer-groups/a-audit/change-invisible",
        {**change, "receipt_handle": "1.000000000000000000000000"},
        format="json",
    )
    assert changed.status_code == 400
    assert answer(changed) == answer(none)
    # The positive control: the handle is still B's, live, and acks for B.
    mine = {"receipt_handles": [handle]}
    acked = b.post("/api/v1/consumer-groups/b-billing/ack", mine, format="json")
    assert acked.json()["acked"] == [handle]
