"""The console's destructive actions without a confirmation page of their own (Revoke a token,
Rotate a producer group's secret) ask on a page of the server's, as the admin's delete does: the
list's control opens it (a GET, which changes nothing), and its form POSTs, with the CSRF token,
for an operator only (docs/decisions/0114). Driven here as a browser without script would: follow
the control the list shows, then the form the page shows."""

from collections.abc import Callable
from html.parser import HTMLParser
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from apps.broker.models import ApiToken, AuditRecord, ProducerGroup
from apps.broker.services import registry
from tests.support.console import login


class Controls(HTMLParser):
    """The forms (method, action, hidden fields) and links of a page."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.forms: list[dict[str, Any]] = []
        self.links: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {name: value or "" for name, value in attrs}
        if tag == "form":
            method = found.get("method", "get").lower()
            self.forms.append({"method": method, "action": found.get("action", ""), "data": {}})
        elif tag == "input" and found.get("type") == "hidden" and self.forms:
            self.forms[-1]["data"][found.get("name", "")] = found.get("value", "")
        elif tag == "a" and "href" in found:
            self.links.append(found["href"])


def follow(client: Client, page: str, target: str, *, here: str) -> Any:
    """What a browser without script does on `page` with the control aimed at `target`."""
    controls = Controls(page)
    for form in controls.forms:
        if (form["action"] or here) == target:
            return getattr(client, form["method"])(target, form["data"])
    assert target in controls.links, (target, controls.links)
    return client.get(target)


def operator() -> Client:
    client = login("txhub-operators", "otto")
    client.handler.enforce_csrf_checks = True
    return client


def confirm(client: Client, list_path: str, target: str) -> tuple[Any, Callable[[], Any]]:
    """Follows the list's control, checks a confirmation page came, and confirms on it."""
    asked = follow(client, client.get(list_path).content.decode(), target, here=list_path)
    assert asked.status_code == 200, asked.status_code
    page = asked.content.decode()
    assert f'href="{list_path}">Cancel</a>' in page
    return asked, lambda: follow(client, page, target, here=target)


@pytest.fixture
def setup(db: None) -> dict[str, Any]:
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/check")
    token, _ = registry.token_create(name="ci\u202egpj", scopes=["produce:shop"])
    return {"token": token}


def test_revoke_asks_on_a_page_before_anything_is_revoked(setup: dict[str, Any]) -> None:
    token = setup["token"]
    target = reverse("console:token-revoke", args=[token.pk])
    asked, confirmed = confirm(operator(), reverse("console:tokens"), target)
    assert "Revoke token ci[U+202E]gpj?" in asked.content.decode()
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None
    assert not AuditRecord.objects.filter(action="token_revoke").exists()
    assert confirmed().status_code == 302
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
    assert AuditRecord.objects.filter(action="token_revoke").count() == 1


def test_rotate_asks_on_a_page_before_the_secret_changes(setup: dict[str, Any]) -> None:
    before = ProducerGroup.objects.get(name="shop").signing_secret
    target = reverse("console:producer-group-rotate", args=["shop"])
    asked, confirmed = confirm(operator(), reverse("console:producer-groups"), target)
    assert "Rotate the signing secret of shop?" in asked.content.decode()
    assert ProducerGroup.objects.get(name="shop").signing_secret == before
    assert confirmed().status_code == 302
    assert ProducerGroup.objects.get(name="shop").signing_secret != before


@pytest.mark.parametrize("what", ["token-revoke", "producer-group-rotate"])
def test_the_confirmation_page_is_an_operators_and_its_form_needs_the_csrf_token(
    setup: dict[str, Any], what: str
) -> None:
    args = [setup["token"].pk if what == "token-revoke" else "shop"]
    target = reverse(f"console:{what}", args=args)
    before = list(ProducerGroup.objects.values_list("signing_secret", flat=True))
    viewer = login("txhub-viewers", "vera")
    assert viewer.get(target).status_code == 403
    client = operator()
    page = client.get(target).content.decode()
    form = next(form for form in Controls(page).forms if form["method"] == "post")
    assert "csrfmiddlewaretoken" in form["data"]
    assert client.post(target, {}).status_code == 403  # no token: refused
    assert ApiToken.objects.get(pk=setup["token"].pk).revoked_at is None
    assert list(ProducerGroup.objects.values_list("signing_secret", flat=True)) == before


def test_a_confirmation_page_for_nothing_is_the_consoles_not_found(setup: dict[str, Any]) -> None:
    client = operator()
    for target in [
        reverse("console:token-revoke", args=[setup["token"].pk + 1000]),
        reverse("console:producer-group-rotate", args=["nope"]),
    ]:
        response = client.get(target)
        assert response.status_code == 404, target
        assert "<h1>Not found</h1>" in response.content.decode(), target
