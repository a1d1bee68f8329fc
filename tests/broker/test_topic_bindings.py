"""Topic bindings (CONTRACT section 6, docs/decisions/0010): a group bound to topics may use only
those (403 otherwise, before anything is stored); a group bound to none keeps using any topic."""

import json
import urllib.parse
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.broker.models import (
    CommitLogEntry,
    ConsumerCursor,
    ConsumerGroup,
    DelayedMessage,
    Delivery,
    HalfMessage,
    MessageQueue,
    ProducerGroup,
)


@pytest.fixture
def names(api: APIClient, setup_topic: Any) -> dict[str, Any]:
    """orders and payments; order-service and billing, both bound to nothing yet."""
    created: dict[str, Any] = setup_topic()
    assert api.post("/api/v1/topics", {"name": "payments"}, format="json").status_code == 201
    return created


def bind(api: APIClient, kind: str, group: str, topics: list[Any]) -> Any:
    return api.put(f"/api/v1/{kind}-groups/{group}/topics", {"topics": topics}, format="json")


def stored() -> tuple[int, ...]:
    """Everything a send, prepare or receive could have written."""
    return (
        HalfMessage.objects.count(),
        CommitLogEntry.objects.count(),
        DelayedMessage.objects.count(),
        ConsumerCursor.objects.count(),
        Delivery.objects.count(),
        sum(MessageQueue.objects.values_list("next_offset", flat=True)),
    )


def assert_forbidden(response: Any, **details: str) -> None:
    assert response.status_code == 403, response.content
    error = response.json()["error"]
    assert error["code"] == "forbidden"
    assert "not bound to topic" in error["message"]
    assert error["details"] == details


def send(client: APIClient, topic: str, **extra: Any) -> Any:
    body = {"producer_group": "order-service", "body": "x", **extra}
    return client.post(f"/api/v1/topics/{topic}/messages", body, format="json")


def prepare(client: APIClient, topic: str) -> Any:
    body = {"producer_group": "order-service", "topic": topic, "body": "x"}
    return client.post("/api/v1/transactions", body, format="json")


def receive(client: APIClient, topic: str) -> Any:
    return client.post("/api/v1/consumer-groups/billing/receive", {"topic": topic}, format="json")


def test_a_bound_producer_sending_to_another_topic_is_403_and_stores_nothing(
    api: APIClient, make_client: Any, names: dict[str, Any]
) -> None:
    assert bind(api, "producer", "order-service", ["payments"]).status_code == 200
    producer = make_client("produce:order-service")
    before = stored()
    assert_forbidden(send(producer, "orders"), producer_group="order-service", topic="orders")
    assert_forbidden(
        send(producer, "orders", delay_level=3), producer_group="order-service", topic="orders"
    )
    assert stored() == before


def test_a_bound_producer_preparing_on_another_topic_is_403_and_stores_nothing(
    api: APIClient, make_client: Any, names: dict[str, Any]
) -> None:
    assert bind(api, "producer", "order-service", ["payments"]).status_code == 200
    before = stored()
    response = prepare(make_client("produce:order-service"), "orders")
    assert_forbidden(response, producer_group="order-service", topic="orders")
    assert stored() == before


def test_a_bound_producer_sends_and_prepares_on_its_topics(
    api: APIClient, make_client: Any, names: dict[str, Any]
) -> None:
    assert bind(api, "producer", "order-service", ["payments", "orders"]).status_code == 200
    producer = make_client("produce:order-service")
    assert send(producer, "orders").status_code == 201
    assert send(producer, "payments").status_code == 201
    assert prepare(producer, "payments").status_code == 201
    assert CommitLogEntry.objects.count() == 2
    assert HalfMessage.objects.count() == 1


def test_a_bound_group_naming_a_topic_that_does_not_exist_is_403_like_any_other(
    api: APIClient, make_client: Any, names: dict[str, Any]
) -> None:
    # Whether a topic outside the bindings exists is none of the bound group's business.
    bind(api, "producer", "order-service", ["payments"])
    bind(api, "consumer", "billing", ["payments"])
    before = stored()
    assert_forbidden(
        send(make_client("produce:order-service"), "nowhere"),
        producer_group="order-service",
        topic="nowhere",
    )
    assert_forbidden(
        receive(make_client("consume:billing"), "nowhere"),
        consumer_group="billing",
        topic="nowhere",
    )
    assert stored() == before


@pytest.mark.parametrize("topic", ["%00", "a%00b", "x" * 300, "%F0%9F%92%A9", "%ED%A0%80"])
def test_a_bound_producer_naming_a_malformed_topic_is_refused_and_stores_nothing(
    api: APIClient, make_client: Any, names: dict[str, Any], topic: str
) -> None:
    """In the URL a name that cannot exist is no endpoint at all (404, before any view, for
    every token: it tells nothing about bindings); in the body the binding answers 403."""
    bind(api, "producer", "order-service", ["payments"])
    before = stored()
    producer = make_client("produce:order-service")
    response = send(producer, topic)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    raw = urllib.parse.unquote(topic, errors="surrogatepass")
    payload = {"producer_group": "order-service", "topic": raw, "body": "x"}
    response = producer.generic(
        "POST", "/api/v1/transactions", json.dumps(payload), content_type="application/json"
    )
    assert response.status_code in {400, 403}  # malformed name (400) or outside the binding
    assert response.json()["error"]["code"] in {"invalid_request", "forbidden"}
    assert stored() == before


def test_unbound_groups_and_missing_topics_keep_todays_answers(
    make_client: Any, names: dict[str, Any]
) -> None:
    producer = make_client("produce:order-service")
    consumer = make_client("consume:billing")
    assert send(producer, "orders").status_code == 201
    assert send(producer, "payments").status_code == 201
    assert prepare(producer, "payments").status_code == 201
    assert len(receive(consumer, "orders").json()["messages"]) == 1
    assert len(receive(consumer, "payments").json()["messages"]) == 1
    assert send(producer, "nowhere").json()["error"]["code"] == "not_found"
    assert receive(consumer, "nowhere").json()["error"]["code"] == "not_found"


def test_a_bound_consumer_receiving_from_another_topic_is_403_and_stores_nothing(
    api: APIClient, make_client: Any, names: dict[str, Any]
) -> None:
    send(make_client("produce:order-service"), "orders")
    assert bind(api, "consumer", "billing", ["payments"]).status_code == 200
    consumer = make_client("consume:billing")
    before = stored()
    assert_forbidden(receive(consumer, "orders"), consumer_group="billing", topic="orders")
    assert stored() == before
    assert receive(consumer, "payments").status_code == 200
    bind(api, "consumer", "billing", ["payments", "orders"])
    assert len(receive(consumer, "orders").json()["messages"]) == 1


def test_a_producer_and_a_consumer_group_of_one_name_keep_their_own_bindings(
    api: APIClient, make_client: Any, names: dict[str, Any]
) -> None:
    # Group names are unique per kind only: the bindings the access module keeps are keyed by
    # both (decision 0107), or the one read first would answer for the other.
    check_url = "http://127.0.0.1:9/check"
    group = {"name": "billing", "check_url": check_url}
    answer = api.post("/api/v1/producer-groups", group, format="json")
    assert answer.status_code == 201
    assert bind(api, "producer", "billing", ["payments"]).status_code == 200
    assert bind(api, "consumer", "billing", ["orders"]).status_code == 200
    both = make_client("produce:billing", "consume:billing")
    assert send(both, "payments", producer_group="billing").status_code == 201
    assert receive(both, "orders").status_code == 200
    before = stored()
    assert_forbidden(
        send(both, "orders", producer_group="billing"), producer_group="billing", topic="orders"
    )
    assert_forbidden(receive(both, "payments"), consumer_group="billing", topic="payments")
    assert stored() == before
    # The consumer's binding read first, the producer's then: each is still its own.
    assert bind(api, "consumer", "billing", ["orders"]).status_code == 200  # a new epoch
    assert receive(both, "orders").status_code == 200
    assert send(both, "payments", producer_group="billing").status_code == 201


def test_binding_to_no_topic_lets_the_group_use_any_topic_again(
    api: APIClient, make_client: Any, names: dict[str, Any]
) -> None:
    bind(api, "producer", "order-service", ["payments"])
    producer = make_client("produce:order-service")
    assert send(producer, "orders").status_code == 403
    answer = bind(api, "producer", "order-service", [])
    assert answer.status_code == 200
    assert answer.json()["topics"] == []
    assert send(producer, "orders").status_code == 201


def test_the_group_pages_of_the_api_show_the_bindings(
    api: APIClient, make_client: Any, names: dict[str, Any]
) -> None:
    answer = bind(api, "producer", "order-service", ["payments", "orders", "orders"])
    assert answer.json()["topics"] == ["orders", "payments"]
    assert api.get("/api/v1/producer-groups/order-service").json()["topics"] == [
        "orders",
        "payments",
    ]
    assert bind(api, "consumer", "billing", ["orders"]).json()["topics"] == ["orders"]
    [producer] = api.get("/api/v1/producer-groups").json()
    assert producer["topics"] == ["orders", "payments"]
    [consumer] = api.get("/api/v1/consumer-groups").json()
    assert consumer["topics"] == ["orders"]
    own = make_client("consume:billing").get("/api/v1/consumer-groups/billing").json()
    assert own["topics"] == ["orders"]


@pytest.mark.parametrize("scopes", [("produce:order-service",), ("consume:billing",)])
def test_only_an_admin_token_binds(
    make_client: Any, names: dict[str, Any], scopes: tuple[str, ...]
) -> None:
    client = make_client(*scopes)
    for kind, group in (("producer", "order-service"), ("consumer", "billing")):
        response = bind(client, kind, group, ["payments"])
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "forbidden"
    assert not ProducerGroup.topics.through.objects.exists()
    assert not ConsumerGroup.topics.through.objects.exists()


def test_a_binding_naming_a_missing_topic_is_404_and_changes_nothing(
    api: APIClient, names: dict[str, Any]
) -> None:
    bind(api, "producer", "order-service", ["orders"])
    for kind, group in (("producer", "order-service"), ("consumer", "billing")):
        response = bind(api, kind, group, ["payments", "nowhere"])
        assert response.status_code == 404
        error = response.json()["error"]
        assert error["code"] == "not_found"
        assert error["details"] == {"topics": ["nowhere"]}
    assert api.get("/api/v1/producer-groups/order-service").json()["topics"] == ["orders"]
    assert not ConsumerGroup.topics.through.objects.exists()


def test_binding_a_missing_group_is_404(api: APIClient, names: dict[str, Any]) -> None:
    for kind in ("producer", "consumer"):
        response = bind(api, kind, "nobody", ["orders"])
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"topics": "orders"},
        {"topics": [7]},
        {"topics": ["bad name"]},
        {"topics": ["txhub_internal"]},
        {"topics": ["a\x00b"]},
        {"topics": ["orders"], "extra": 1},
        {"topics": ["orders"] * 1001},
        [],
    ],
)
def test_bad_binding_input_is_400_and_changes_nothing(
    api: APIClient, names: dict[str, Any], body: Any
) -> None:
    for kind, group in (("producer", "order-service"), ("consumer", "billing")):
        response = api.put(f"/api/v1/{kind}-groups/{group}/topics", body, format="json")
        assert response.status_code == 400, response.content
        assert response.json()["error"]["code"] == "invalid_request"
        assert len(response.content) < 4096
    assert not ProducerGroup.topics.through.objects.exists()
    assert not ConsumerGroup.topics.through.objects.exists()


def test_bad_input_is_400_before_a_binding_is_403(
    api: APIClient, make_client: Any, names: dict[str, Any]
) -> None:
    # The documented order: 401 -> 400 -> 403 -> 404.
    bind(api, "producer", "order-service", ["payments"])
    response = send(make_client("produce:order-service"), "orders", delay_level=99)
    assert response.status_code == 400
    response = make_client("produce:someone-else").post(
        "/api/v1/topics/orders/messages",
        {"producer_group": "order-service", "body": "x"},
        format="json",
    )
    assert response.status_code == 403
    assert "scope" in response.json()["error"]["message"]
