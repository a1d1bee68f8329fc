"""GET /api/v1/messages/{msg_id} shows only what the caller's scopes cover: a producer its own
messages, with the deliveries of the consumer groups it holds scopes for; a consumer a committed
message on a topic it may receive from, with its own group's deliveries; an admin everything."""

from typing import Any

import pytest
from rest_framework.test import APIClient


@pytest.fixture
def traced(api: APIClient, setup_topic: Any) -> dict[str, Any]:
    """A committed transactional message received by billing and shipping, and a prepared one."""
    setup_topic()
    for group in ("shipping", "audit"):
        api.post("/api/v1/consumer-groups", {"name": group}, format="json")
    body = {"producer_group": "order-service", "topic": "orders", "body": "x"}
    committed = api.post("/api/v1/transactions", body, format="json").json()
    api.post(f"/api/v1/transactions/{committed['transaction_id']}/commit", {}, format="json")
    prepared = api.post("/api/v1/transactions", body, format="json").json()
    for group in ("billing", "shipping"):
        received = api.post(
            f"/api/v1/consumer-groups/{group}/receive", {"topic": "orders"}, format="json"
        )
        assert len(received.json()["messages"]) == 1
    return {"committed": committed["msg_id"], "prepared": prepared["msg_id"]}


def trace(client: APIClient, msg_id: str) -> Any:
    return client.get(f"/api/v1/messages/{msg_id}")


def delivered_to(response: Any) -> list[str]:
    assert response.status_code == 200, response.content
    return [d["consumer_group"] for d in response.json()["deliveries"]]


def test_an_admin_sees_every_groups_deliveries(api: APIClient, traced: dict[str, Any]) -> None:
    response = trace(api, traced["committed"])
    assert delivered_to(response) == ["billing", "shipping"]
    assert response.json()["transaction"]["state"] == "COMMITTED"


def test_a_producer_sees_its_message_but_no_other_groups_deliveries(
    make_client: Any, traced: dict[str, Any]
) -> None:
    producer = make_client("produce:order-service")
    response = trace(producer, traced["committed"])
    assert delivered_to(response) == []
    assert response.json()["transaction"]["state"] == "COMMITTED"
    assert response.json()["commit_log"]["topic"] == "orders"
    assert trace(producer, traced["prepared"]).json()["transaction"]["state"] == "PREPARED"


def test_a_producer_sees_the_deliveries_of_the_consumer_groups_it_holds(
    make_client: Any, traced: dict[str, Any]
) -> None:
    both = make_client("produce:order-service", "consume:shipping")
    assert delivered_to(trace(both, traced["committed"])) == ["shipping"]


def test_a_consumer_sees_a_committed_message_with_only_its_groups_delivery(
    make_client: Any, traced: dict[str, Any]
) -> None:
    response = trace(make_client("consume:billing"), traced["committed"])
    assert delivered_to(response) == ["billing"]
    data = response.json()
    assert data["msg_id"] == traced["committed"]
    assert data["commit_log"]["topic"] == "orders"
    # The transaction's history (check-backs, operators' reasons) is the producer's.
    assert data["transaction"] is None
    # A group that has not received it yet may look it up too, and sees no delivery.
    assert delivered_to(trace(make_client("consume:audit"), traced["committed"])) == []


def test_a_consumer_never_sees_a_message_that_is_not_committed(
    make_client: Any, traced: dict[str, Any]
) -> None:
    response = trace(make_client("consume:billing"), traced["prepared"])
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_a_consumer_bound_to_other_topics_cannot_look_the_message_up(
    api: APIClient, make_client: Any, traced: dict[str, Any]
) -> None:
    api.post("/api/v1/topics", {"name": "payments"}, format="json")
    api.put("/api/v1/consumer-groups/billing/topics", {"topics": ["payments"]}, format="json")
    assert trace(make_client("consume:billing"), traced["committed"]).status_code == 404
    api.put("/api/v1/consumer-groups/billing/topics", {"topics": ["orders"]}, format="json")
    assert delivered_to(trace(make_client("consume:billing"), traced["committed"])) == ["billing"]


@pytest.mark.parametrize(
    "scopes",
    [("produce:someone-else",), ("consume:nobody",), ("produce:someone-else", "consume:nobody")],
)
def test_a_token_without_a_covering_scope_gets_404(
    make_client: Any, traced: dict[str, Any], scopes: tuple[str, ...]
) -> None:
    client = make_client(*scopes)
    for msg_id in traced.values():
        assert trace(client, msg_id).status_code == 404
