"""The README's tour, over real HTTP against gunicorn."""

import pytest
import requests

from tests.conftest import Server
from tests.support.responses import assert_error

pytestmark = pytest.mark.e2e


def test_the_readme_tour_works_over_http(server: Server) -> None:
    admin = server.token("admin")
    s = requests.Session()
    s.headers.update(admin)

    def call(method: str, path: str, json: object = None, status: int = 200) -> dict:  # type: ignore[type-arg]
        response = s.request(method, server.url(path), json=json, timeout=30)
        assert response.status_code == status, response.text
        assert response.headers["Content-Type"] == "application/json"
        return response.json() if response.content else {}

    call("POST", "/api/v1/topics", {"name": "orders", "queues": 4}, 201)
    call(
        "POST",
        "/api/v1/producer-groups",
        {"name": "order-service", "check_url": "http://127.0.0.1:9000/check"},
        201,
    )
    call("POST", "/api/v1/consumer-groups", {"name": "billing"}, 201)
    token = call(
        "POST",
        "/api/v1/tokens",
        {"name": "shop", "scopes": ["produce:order-service", "consume:billing"]},
        201,
    )
    s.headers["Authorization"] = f"Bearer {token['token']}"
    sent = call(
        "POST",
        "/api/v1/topics/orders/messages",
        {"producer_group": "order-service", "body": "hello"},
        201,
    )
    assert sent["status"] == "SEND_OK"
    tx = call(
        "POST",
        "/api/v1/transactions",
        {"producer_group": "order-service", "topic": "orders", "body": "order 9527 created"},
        201,
    )
    received = call("POST", "/api/v1/consumer-groups/billing/receive", {"topic": "orders"})[
        "messages"
    ]
    assert [m["msg_id"] for m in received] == [sent["msg_id"]]
    committed = call("POST", f"/api/v1/transactions/{tx['transaction_id']}/commit")
    assert committed["state"] == "COMMITTED"
    more = call(
        "POST", "/api/v1/consumer-groups/billing/receive", {"topic": "orders", "wait_seconds": 2}
    )
    assert [m["body"] for m in more["messages"]] == ["order 9527 created"]
    handles = [m["receipt_handle"] for m in received + more["messages"]]
    assert (
        call("POST", "/api/v1/consumer-groups/billing/ack", {"receipt_handles": handles})["acked"]
        == handles
    )
    assert requests.get(server.url("/readyz"), timeout=5).json()["status"] == "ok"
    wrong = requests.post(
        server.url("/api/v1/topics"),
        data="{",
        headers={**admin, "Content-Type": "application/json"},
        timeout=5,
    )
    assert_error(wrong, 400, "invalid_request")
