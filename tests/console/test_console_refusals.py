"""A refusal under /console/ (a viewer's operator action, a user in no txhub group) answers the
console's own page: HTML and 403, with the console's navigation, why, what the user may do and a
link back; an API refusal keeps the contract's JSON error (docs/decisions/0103)."""

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.broker.models import HalfMessage
from apps.broker.services import registry
from tests.support.console import login


def refused_page(response: Any, url: str) -> str:
    assert response.status_code == 403, url
    assert response["Content-Type"].startswith("text/html"), url
    page: str = response.content.decode()
    assert "<h1>Not allowed</h1>" in page, url
    return page


@pytest.mark.parametrize(
    ("method", "path", "reason"),
    [
        ("post", "/console/transactions/{id}/commit/", "Only txhub operators can act"),
        ("get", "/console/audit/", "Only txhub operators can read the audit record."),
        ("post", "/console/topics/new/", "Only txhub operators can change the configuration."),
        ("post", "/console/tokens/1/revoke/", "Only txhub operators can change the configuration."),
    ],
)
def test_a_viewers_refusal_is_the_consoles_page_and_says_what_they_may_do(
    half: HalfMessage, method: str, path: str, reason: str
) -> None:
    vera = login("txhub-viewers", "vera")
    url = path.format(id=half.transaction_id)
    page = refused_page(getattr(vera, method)(url, {"reason": "x", "confirm": "on"}), url)
    assert reason in page, url
    assert "You may read every page of the console." in page, url
    assert 'href="/console/transactions/"' in page, url  # the console's navigation
    assert '<a href="/console/">Back</a>' in page, url  # no Referer: back to the overview
    assert HalfMessage.objects.get(pk=half.pk).state == "PREPARED"


def test_the_link_back_is_the_console_page_the_user_came_from(half: HalfMessage) -> None:
    vera = login("txhub-viewers", "vera")
    detail = f"/console/transactions/{half.transaction_id}/"
    action = f"{detail}commit/"
    came_from = {
        f"http://testserver{detail}": detail,
        "http://testserver/console/transactions/?state=PREPARED": (
            "/console/transactions/?state=PREPARED"
        ),
        # Not a page of this console: back to the overview, never elsewhere.
        f"http://evil.example{detail}": "/console/",
        "http://testserver/admin/": "/console/",
        f"http://testserver{action}": "/console/",  # this very URL: it takes POST only
    }
    for referer, back in came_from.items():
        page = refused_page(vera.post(action, {"reason": "x"}, HTTP_REFERER=referer), referer)
        assert f'<a href="{back}">Back</a>' in page, referer


def test_a_user_in_no_txhub_group_is_told_to_ask_for_one(db: None) -> None:
    nobody = login(None, "nobody")
    page = refused_page(nobody.get("/console/transactions/"), "/console/transactions/")
    assert "You are not in the txhub viewers or operators group." in page
    assert "txhub-viewers" in page
    assert "txhub-operators" in page
    assert 'href="/console/login/"' in page  # sign in as another user


def test_an_api_refusal_keeps_the_contracts_json_error(half: HalfMessage) -> None:
    _, raw = registry.token_create(name="reader", scopes=["consume:billing"])
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = api.post("/api/v1/topics", {"name": "ledger", "queues": 1}, format="json")
    assert response.status_code == 403
    assert response["Content-Type"] == "application/json"
    assert json.loads(response.content)["error"]["code"] == "forbidden"
    # The same refusal in the console is a page (the control that this door was reached).
    vera = login("txhub-viewers", "vera")
    refused_page(vera.post(f"/console/transactions/{half.transaction_id}/commit/"), "console")
