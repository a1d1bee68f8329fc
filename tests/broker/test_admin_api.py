"""Topics, producer groups, consumer groups (CONTRACT section 3, Administration)."""

from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.broker.models import MessageQueue, ProducerGroup
from tests.support.responses import assert_error, expect


def test_a_topic_is_created_with_its_queues(api: APIClient) -> None:
    response = api.post("/api/v1/topics", {"name": "orders", "queues": 3}, format="json")
    assert response.status_code == 201
    assert MessageQueue.objects.filter(topic__name="orders").count() == 3
    detail = api.get("/api/v1/topics/orders").json()
    assert [q["max_offset"] for q in detail["queue_offsets"]] == [0, 0, 0]
    assert [t["name"] for t in api.get("/api/v1/topics").json()] == ["orders"]


def test_a_topic_that_exists_is_409(api: APIClient) -> None:
    expect(api.post("/api/v1/topics", {"name": "orders"}, format="json"), 201)
    response = api.post("/api/v1/topics", {"name": "orders", "queues": 8}, format="json")
    assert_error(response, 409, "conflict")
    assert MessageQueue.objects.filter(topic__name="orders").count() == 4


def test_an_unknown_topic_is_404(api: APIClient) -> None:
    response = api.get("/api/v1/topics/nope")
    assert_error(response, 404, "not_found")


def test_a_producer_group_shows_its_secret_once_and_rotates(api: APIClient) -> None:
    created = expect(
        api.post(
            "/api/v1/producer-groups",
            {"name": "pg", "check_url": "http://127.0.0.1:9000/check"},
            format="json",
        ),
        201,
    )
    assert created["signing_secret"].startswith("whsec_")
    assert "signing_secret" not in api.get("/api/v1/producer-groups/pg").json()
    rotated = expect(api.post("/api/v1/producer-groups/pg/rotate-secret"), 200)
    assert rotated["signing_secret"] != created["signing_secret"]
    group = ProducerGroup.objects.get(name="pg")
    assert group.previous_signing_secret == created["signing_secret"]
    patched = api.patch(
        "/api/v1/producer-groups/pg", {"check_url": "http://127.0.0.1:9001/tx"}, format="json"
    )
    assert expect(patched, 200)["check_url"] == "http://127.0.0.1:9001/tx"


def test_a_producer_group_may_have_no_check_url(api: APIClient) -> None:
    """Issue 11: a gRPC-only producer group is checked over its producers' streams; with none
    connected and no check_url its checks count as unreachable (no budget used)."""
    created = expect(api.post("/api/v1/producer-groups", {"name": "grpc-only"}, format="json"), 201)
    assert created["check_url"] == ""
    assert created["signing_secret"].startswith("whsec_")
    assert ProducerGroup.objects.get(name="grpc-only").check_url == ""


def test_a_consumer_group_has_rocketmq_defaults(api: APIClient) -> None:
    created = expect(api.post("/api/v1/consumer-groups", {"name": "billing"}, format="json"), 201)
    assert created["max_delivery_attempts"] == 16
    assert created["consume_from"] == "first"
    again = api.post("/api/v1/consumer-groups", {"name": "billing"}, format="json")
    assert_error(again, 409, "conflict")


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.5/check",  # private
        "http://192.168.1.1/check",
        "http://169.254.169.254/latest/meta-data",  # cloud metadata (link-local)
        "http://[fe80::1]/check",
        "http://0.0.0.0/check",
        "ftp://127.0.0.1/check",
        "http://no-such-host.invalid/check",
    ],
)
def test_a_check_url_to_an_internal_address_is_refused(api: APIClient, url: str) -> None:
    response = api.post("/api/v1/producer-groups", {"name": "pg", "check_url": url}, format="json")
    assert_error(response, 400, "invalid_request")
    assert not ProducerGroup.objects.exists()


def test_loopback_is_allowed_only_while_configured(api: APIClient, settings: Any) -> None:
    ok = api.post(
        "/api/v1/producer-groups", {"name": "a", "check_url": "http://127.0.0.1:9/x"}, format="json"
    )
    assert ok.status_code == 201
    settings.TXHUB_CALLBACK_ALLOWED_HOSTS = []
    refused = api.post(
        "/api/v1/producer-groups", {"name": "b", "check_url": "http://127.0.0.1:9/x"}, format="json"
    )
    assert_error(refused, 400, "invalid_request")
