"""Tokens and scopes: 401 without a token, 403 without the group's scope, 404 for another
group's ids, revocation at once."""

from typing import Any

from django.core.management import call_command
from rest_framework.test import APIClient

from apps.broker.models import HalfMessage
from tests.support.responses import assert_error, expect


def test_no_token_is_401_in_the_contract_format(db: None) -> None:
    response = APIClient().get("/api/v1/topics")
    assert_error(response, 401, "unauthenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_an_unknown_token_is_401(db: None) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer txh_not-a-token")
    assert_error(client.get("/api/v1/topics"), 401, "unauthenticated")


def test_a_producer_token_cannot_administer(make_client: Any) -> None:
    client = make_client("produce:order-service")
    response = client.post("/api/v1/topics", {"name": "x"}, format="json")
    assert_error(response, 403, "forbidden")


def test_sending_for_a_group_outside_the_token_scope_is_403_and_stores_nothing(
    make_client: Any, setup_topic: Any
) -> None:
    names = setup_topic()
    client = make_client("produce:someone-else")
    response = client.post(
        "/api/v1/transactions",
        {"producer_group": names["producer"], "topic": names["topic"], "body": "x"},
        format="json",
    )
    assert_error(response, 403, "forbidden")
    assert HalfMessage.objects.count() == 0


def test_another_groups_transaction_answers_404(
    make_client: Any, api: APIClient, setup_topic: Any
) -> None:
    names = setup_topic()
    expect(
        api.post(
            "/api/v1/producer-groups",
            {"name": "other", "check_url": "http://127.0.0.1:9/"},
            format="json",
        ),
        201,
    )
    tx = expect(
        api.post(
            "/api/v1/transactions",
            {"producer_group": names["producer"], "topic": names["topic"], "body": "x"},
            format="json",
        ),
        201,
    )
    other = make_client("produce:other")
    for path in ("", "/commit", "/rollback"):
        method = other.get if not path else other.post
        response = method(f"/api/v1/transactions/{tx['transaction_id']}{path}", format="json")
        assert_error(response, 404, "not_found")
    assert_error(other.get(f"/api/v1/messages/{tx['msg_id']}"), 404, "not_found")
    assert expect(other.get("/api/v1/transactions"), 200)["count"] == 0
    assert HalfMessage.objects.get().state == "PREPARED"


def test_a_consumer_token_is_limited_to_its_group(make_client: Any, setup_topic: Any) -> None:
    names = setup_topic()
    mine = make_client(f"consume:{names['consumer']}")
    assert (
        mine.post(
            f"/api/v1/consumer-groups/{names['consumer']}/receive",
            {"topic": names["topic"]},
            format="json",
        ).status_code
        == 200
    )
    other = make_client("consume:someone-else")
    refused = other.post(
        f"/api/v1/consumer-groups/{names['consumer']}/receive",
        {"topic": names["topic"]},
        format="json",
    )
    assert_error(refused, 403, "forbidden")
    assert_error(other.get(f"/api/v1/consumer-groups/{names['consumer']}"), 403, "forbidden")


def test_a_revoked_token_fails_at_once(api: APIClient) -> None:
    created = expect(
        api.post("/api/v1/tokens", {"name": "ci", "scopes": ["admin"]}, format="json"), 201
    )
    assert created["token"].startswith("txh_")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {created['token']}")
    assert client.get("/api/v1/topics").status_code == 200
    assert api.delete(f"/api/v1/tokens/{created['id']}").status_code == 204
    assert_error(client.get("/api/v1/topics"), 401, "unauthenticated")


def test_tokens_are_stored_hashed(api: APIClient) -> None:
    from apps.broker.models import ApiToken

    created = expect(
        api.post("/api/v1/tokens", {"name": "ci", "scopes": ["consume:g"]}, format="json"), 201
    )
    stored = ApiToken.objects.get(id=created["id"])
    assert created["token"] not in stored.token_hash
    assert "token" not in api.get("/api/v1/tokens").json()[0]


def test_create_token_command_prints_the_token_alone(db: None, capsys: Any) -> None:
    call_command("create_token", "ops", "--scope", "admin")
    printed = capsys.readouterr().out.strip()
    assert printed.startswith("txh_")
    assert " " not in printed
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {printed}")
    assert client.get("/api/v1/topics").status_code == 200
