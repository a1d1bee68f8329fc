"""The Swagger UI at /api/docs/ carries the Content-Security-Policy of the console's and the
admin's pages (docs/decisions/0092) and still works under it, in a real headless Chromium
against a real gunicorn: the page's start-up script is a file of its own, not inline."""

import pytest
from playwright.sync_api import ConsoleMessage, Page, expect

pytestmark = pytest.mark.e2e

POLICY_PARTS = ("script-src 'self'", "object-src 'none'", "base-uri 'none'", "frame-ancestors")


def test_the_api_docs_carry_the_policy_and_work_under_it(page: Page) -> None:
    refused: list[str] = []

    def watch(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            refused.append(message.text)

    page.on("console", watch)
    response = page.goto("/api/docs/")
    assert response is not None
    assert response.status == 200
    policy = response.headers.get("content-security-policy", "")
    for part in POLICY_PARTS:
        assert part in policy, policy
    # Swagger UI drew the API's operations from the schema, and nothing was refused.
    expect(page.locator(".opblock").first).to_be_visible(timeout=15000)
    expect(page.locator(".swagger-ui .title").first).to_contain_text("txhub API")
    page.locator(".opblock-summary").first.click()
    expect(page.locator(".opblock-body").first).to_be_visible()
    assert refused == []
    # The positive control: under the policy an inline script does not run, and is reported.
    page.evaluate(
        """() => { const s = document.createElement('script');
                   s.textContent = 'window.__ran = 1'; document.body.append(s); }"""
    )
    assert page.evaluate("window.__ran") is None
    assert refused, "Chromium reported no refused inline script"
