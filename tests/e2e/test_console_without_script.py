"""The console's links work in a real headless Chromium with JavaScript off (docs/decisions/0103):
"Back" on a form page shown again with its errors leads to the page the form was on, and a
refusal is the console's page, whose "Back" leads to the page the user came from. Revoke asks on
a page before it revokes (docs/decisions/0114)."""

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import Group, User
from playwright.sync_api import Browser, Page, expect

from apps.broker.models import ApiToken
from apps.broker.services import registry
from tests.conftest import Server

pytestmark = pytest.mark.e2e


@pytest.fixture
def page(browser: Browser, server: Server) -> Iterator[Page]:
    context = browser.new_context(base_url=server.base, java_script_enabled=False)
    opened = context.new_page()
    yield opened
    context.close()


def sign_in(page: Page, role: str, name: str) -> None:
    user = User.objects.create_user(name, password=f"{name}-pass-9527")
    # get_or_create: transactional tests flush the groups the migration made
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    page.goto("/console/login/")
    page.fill("#id_username", name)
    page.fill("#id_password", f"{name}-pass-9527")
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Overview")


def test_back_on_a_form_page_leads_to_the_page_the_form_was_on(page: Page) -> None:
    sign_in(page, "txhub-operators", "otto")
    page.goto("/console/topics/")
    page.fill("#id_name", "bad name!")
    page.click("text=Create topic")
    expect(page.locator(".errorlist")).to_contain_text("name must match")
    page.get_by_role("link", name="Back", exact=True).click()
    expect(page.locator("h1")).to_have_text("Topics")
    assert page.url.endswith("/console/topics/"), page.url


def test_a_refusal_is_the_consoles_page_and_back_leads_where_the_user_was(
    page: Page, server: Server
) -> None:
    sign_in(page, "txhub-viewers", "vera")
    # A typed URL (no Referer): back to the overview.
    response = page.goto("/console/audit/")
    assert response is not None
    assert response.status == 403
    expect(page.locator("h1")).to_have_text("Not allowed")
    expect(page.locator("main")).to_contain_text("Only txhub operators can read the audit")
    expect(page.locator("header")).to_contain_text("Transactions")  # the console's navigation
    page.get_by_role("link", name="Back", exact=True).click()
    expect(page.locator("h1")).to_have_text("Overview")
    # From a console page (a link kept from when the user was an operator): back to it.
    page.goto("/console/audit/", referer=server.url("/console/topics/"))
    expect(page.locator("h1")).to_have_text("Not allowed")
    page.get_by_role("link", name="Back", exact=True).click()
    expect(page.locator("h1")).to_have_text("Topics")


def test_revoke_asks_on_a_page_and_cancel_revokes_nothing(page: Page) -> None:
    token, _ = registry.token_create(name="ci", scopes=["admin"])
    sign_in(page, "txhub-operators", "otto")
    page.goto("/console/tokens/")
    page.get_by_role("button", name="Revoke").click()
    expect(page.locator("h1")).to_have_text("Revoke token ci?")
    page.get_by_role("link", name="Cancel", exact=True).click()
    expect(page.locator("h1")).to_have_text("API tokens")
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None
    page.get_by_role("button", name="Revoke").click()
    page.get_by_role("button", name="Yes, go ahead").click()
    expect(page.locator("h1")).to_have_text("API tokens")
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
