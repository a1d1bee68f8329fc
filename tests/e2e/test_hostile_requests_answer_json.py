"""Requests Django or the web server refuses before a view answer in the contract's JSON format,
through a real server (the lean door on, as `make run` starts it), and store nothing: a Host
header the server does not answer for, a thousand and one query parameters, a JSON key or a query
parameter given twice, and a method, Accept or Content-Type the endpoint does not take (each
with the code docs/api.md lists for its status). The hot route (`POST /transactions`, the lean
door's) and a route only Django answers (`POST /topics`) are asked alike."""

import json
from typing import Any

import pytest
import requests

from apps.broker.models import HalfMessage, Topic
from apps.broker.services import registry
from tests.conftest import Server

pytestmark = pytest.mark.e2e

MESSAGE = {"producer_group": "shop", "topic": "orders", "body": "order 9527"}


@pytest.fixture
def shop(server: Server) -> dict[str, str]:
    registry.topic_create(name="orders", queues=1)
    registry.producer_group_create(name="shop", check_url="https://127.0.0.1:9/")
    return {
        "Content-Type": "application/json",
        **server.token("produce:shop"),
        "X-Admin": server.token("admin")["Authorization"],
    }


def _error(answer: requests.Response, status: int, code: str) -> dict[str, Any]:
    assert answer.status_code == status, (answer.status_code, answer.text[:300])
    assert answer.headers["Content-Type"] == "application/json", answer.headers
    error: dict[str, Any] = answer.json()["error"]
    assert error["code"] == code, error
    return error


def _post(server: Server, path: str, body: bytes, headers: dict[str, str]) -> requests.Response:
    return requests.post(server.url(path), data=body, headers=headers, timeout=30)


def _admin(headers: dict[str, str]) -> dict[str, str]:
    return {**headers, "Authorization": headers["X-Admin"]}


def test_a_host_the_server_does_not_answer_for_is_a_json_400(
    server: Server, shop: dict[str, str]
) -> None:
    body = json.dumps(MESSAGE).encode()
    evil = {**shop, "Host": "evil.example"}
    error = _error(_post(server, "/api/v1/transactions", body, evil), 400, "invalid_request")
    assert "evil.example" not in error["message"]
    topic = json.dumps({"name": "evil", "queues": 1}).encode()
    _error(_post(server, "/api/v1/topics", topic, _admin(evil)), 400, "invalid_request")
    assert HalfMessage.objects.count() == 0
    assert not Topic.objects.filter(name="evil").exists()
    # Outside the API, Django's own page (the console is HTML).
    page = requests.get(server.url("/console/"), headers={"Host": "evil.example"}, timeout=30)
    assert page.status_code == 400
    assert page.headers["Content-Type"].startswith("text/html")
    # The positive control: the same requests with the server's own Host.
    assert _post(server, "/api/v1/transactions", body, shop).status_code == 201
    assert _post(server, "/api/v1/topics", topic, _admin(shop)).status_code == 201


def test_a_thousand_and_one_query_parameters_are_a_json_400(
    server: Server, shop: dict[str, str]
) -> None:
    many = "&".join(f"a={n}" for n in range(1001))
    listed = requests.get(server.url(f"/api/v1/transactions?{many}"), headers=shop, timeout=30)
    _error(listed, 400, "invalid_request")
    body = json.dumps(MESSAGE).encode()
    _error(_post(server, f"/api/v1/transactions?{many}", body, shop), 400, "invalid_request")
    assert HalfMessage.objects.count() == 0
    assert _post(server, "/api/v1/transactions?a=1", body, shop).status_code == 201


def test_a_json_key_given_twice_is_a_400_naming_it_at_both_doors(
    server: Server, shop: dict[str, str]
) -> None:
    twice = b'{"producer_group": "a", "producer_group": "shop", "topic": "orders", "body": "x"}'
    for body in (twice, b'{"producer_group": "shop", "topic": "orders", "body": "x", '
                 b'"properties": {"k": "1", "k": "2"}}'):  # fmt: skip
        error = _error(_post(server, "/api/v1/transactions", body, shop), 400, "invalid_request")
        key = "producer_group" if body is twice else "k"
        assert key in error["message"]
        assert error["details"] == {key: [error["message"]]}
    topic = b'{"name": "first", "name": "second", "queues": 1}'
    error = _error(_post(server, "/api/v1/topics", topic, _admin(shop)), 400, "invalid_request")
    assert error["details"] == {"name": [error["message"]]}
    assert HalfMessage.objects.count() == 0
    assert not Topic.objects.filter(name__in=["first", "second"]).exists()
    # The positive control: each key once.
    once = b'{"producer_group": "shop", "topic": "orders", "body": "x"}'
    assert _post(server, "/api/v1/transactions", once, shop).status_code == 201
    assert HalfMessage.objects.get().producer_group.name == "shop"


def test_a_query_parameter_given_twice_is_a_400_naming_it(
    server: Server, shop: dict[str, str]
) -> None:
    for query in ("state=PREPARED&state=COMMITTED", "page=1&page=2"):
        listed = requests.get(server.url(f"/api/v1/transactions?{query}"), headers=shop, timeout=30)
        error = _error(listed, 400, "invalid_request")
        name = query.split("=", 1)[0]
        assert error["details"] == {name: [error["message"]]}
    runs = requests.get(
        server.url("/api/v1/reconciliations?page_size=5&page_size=5"),
        headers=_admin(shop),
        timeout=30,
    )
    _error(runs, 400, "invalid_request")  # even the same value twice
    # The positive control: each once.
    listed = requests.get(
        server.url("/api/v1/transactions?state=PREPARED&page=1"), headers=shop, timeout=30
    )
    assert listed.status_code == 200


def test_method_accept_and_content_type_refusals_have_codes_of_their_own(
    server: Server, shop: dict[str, str]
) -> None:
    body = json.dumps(MESSAGE).encode()
    wrong_method = requests.put(server.url("/api/v1/transactions"), headers=shop, timeout=30)
    _error(wrong_method, 405, "method_not_allowed")
    html = {**shop, "Accept": "text/html"}
    _error(_post(server, "/api/v1/transactions", body, html), 406, "not_acceptable")
    text = {**shop, "Content-Type": "text/plain"}
    _error(_post(server, "/api/v1/transactions", body, text), 415, "unsupported_media_type")
    assert HalfMessage.objects.count() == 0
    assert _post(server, "/api/v1/transactions", body, shop).status_code == 201
