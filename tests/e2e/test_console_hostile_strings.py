"""Strings tenants control (bodies, keys, tags, properties, message groups, gRPC client ids and
what clients say about themselves, token names, reasons) on every console and admin page that
shows them, in a real headless Chromium against a real gunicorn: none runs script, adds an element
or widens the page; every page carries the Content-Security-Policy of docs/decisions/0092, under
which an injected inline script would not run and no other site may frame the page."""

import base64
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import ConsoleMessage, Dialog, Page, expect

from apps.broker.models import ApiToken, HalfMessage, Resolver
from apps.broker.services import clients, registry, transactions
from apps.broker.services.sending import OutgoingMessage
from apps.broker.services.transactions import Actor
from tests.conftest import Server
from tests.support.ports import free_port

pytestmark = pytest.mark.e2e

PRODUCER = Actor(Resolver.PRODUCER, "shop-service")
# Each string, if it reached the page as markup, would add an element with id "pwn" or set
# window.__pwned, or open a dialog.
BREAKOUT = '"\'><img id=pwn src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
IN_JS = "');window.__pwned=3;//\\u0027</script><b id=pwn>"
SHORT = '"><b id=pwn>'  # fits a client's language (32 characters)
LONG = "A" * 3000  # no space to break at
# A name reordered by a right-to-left override (it reads "invoiceexe.pdf") and one made to look
# like another by a zero-width space.
SPOOFS = ("invoice\u202efdp.exe", "order\u200b-9527")
INVISIBLE = frozenset(
    map(chr, [0x061C, *range(0x200B, 0x2010), *range(0x202A, 0x202F), *range(0x2066, 0x206A)])
) | {"\ufeff"}
# Secure-CSP parts every console and admin page must carry (docs/decisions/0092).
POLICY_PARTS = (
    "script-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "frame-ancestors 'none'",
)


def seed() -> dict[str, Any]:
    topic = registry.topic_create(name="orders", queues=1)
    group = registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/check")
    registry.consumer_group_create(name="billing", max_delivery_attempts=3, consume_from="LATEST")
    token, _ = registry.token_create(name=BREAKOUT, scopes=["produce:shop"])
    registry.token_create(name=IN_JS, scopes=["produce:shop"])
    registry.token_create(name=SPOOFS[0], scopes=["produce:shop"])

    def prepare(body: bytes, *, binary: bool = False, **fields: Any) -> HalfMessage:
        message = OutgoingMessage(producer_group="shop", body=body, body_is_binary=binary, **fields)
        return transactions.transaction_prepare(
            producer_group=group, topic=topic, message=message, actor=PRODUCER
        )

    hostile = prepare(
        BREAKOUT.encode(),
        tags=IN_JS,
        keys=[BREAKOUT, IN_JS, *SPOOFS],
        properties={BREAKOUT: IN_JS, "x": BREAKOUT, SPOOFS[1]: SPOOFS[0]},
        message_group=IN_JS[:100],
    )
    transactions.transaction_park(
        transaction_id=hostile.transaction_id, actor=Actor(Resolver.SYSTEM, ""), reason=BREAKOUT
    )
    binary = prepare(b"\x00\xff<script>window.__pwned=4</script>\xfe", binary=True, keys=[IN_JS])
    long = prepare(LONG.encode(), keys=[LONG], tags="T" * 128, properties={"p": LONG})
    clients.client_seen(
        client_id=BREAKOUT,
        token_id=token.id,
        client_type="PRODUCER",
        group="shop",
        language=SHORT,
        version=IN_JS,
        hostname=BREAKOUT,
    )
    clients.client_seen(
        client_id=SPOOFS[0],
        token_id=token.id,
        client_type="PRODUCER",
        group="shop",
        hostname=SPOOFS[1],
    )
    return {"halves": [hostile, binary, long], "token": token}


def console_pages(seeded: dict[str, Any]) -> list[str]:
    halves = seeded["halves"]
    return [
        "/console/",
        "/console/transactions/",
        f"/console/transactions/?query={base64.urlsafe_b64encode(b'x').decode()}",
        *(f"/console/transactions/{half.transaction_id}/" for half in halves),
        f"/console/transactions/{halves[0].transaction_id}/rollback/",
        "/console/delayed/",
        "/console/audit/",
        "/console/topics/",
        "/console/producer-groups/",
        "/console/consumer-groups/",
        "/console/consumer-groups/billing/",
        "/console/tokens/",
        "/console/reconciliations/",
    ]


def admin_pages(seeded: dict[str, Any]) -> list[str]:
    halves = seeded["halves"]
    return [
        "/admin/broker/halfmessage/",
        *(f"/admin/broker/halfmessage/{half.pk}/change/" for half in halves),
        "/admin/broker/oprecord/",
        "/admin/broker/apitoken/",
        f"/admin/broker/apitoken/{seeded['token'].pk}/change/",
        "/admin/broker/auditrecord/",
    ]


def superuser_login(page: Page) -> None:
    User.objects.create_superuser("root", password="root-pass-9527")
    page.goto("/console/login/")
    page.fill("#id_username", "root")
    page.fill("#id_password", "root-pass-9527")
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Overview")


class Watch:
    """What a page did that a tenant's string must never make it do."""

    def __init__(self, page: Page) -> None:
        self.dialogs: list[str] = []
        self.accept = False
        self.refused: list[str] = []
        page.on("dialog", self._dialog)
        page.on("console", self._console)

    def _dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(dialog.message)
        if self.accept:
            dialog.accept()
        else:
            dialog.dismiss()

    def _console(self, message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            self.refused.append(message.text)


def injected(page: Page) -> list[str]:
    found: list[str] = page.evaluate(
        """() => [
            ...(window.__pwned === undefined ? [] : [`window.__pwned=${window.__pwned}`]),
            ...[...document.querySelectorAll('#pwn')].map(e => e.outerHTML),
        ]"""
    )
    return found


def test_the_detector_sees_an_injection_on_a_page_without_our_policy(page: Page) -> None:
    """Positive control: the same strings, as markup on a blank page, are caught."""
    watch = Watch(page)
    page.set_content(f"<p>{BREAKOUT}</p><p>{SHORT}</p>")
    page.wait_for_timeout(200)
    found = injected(page)
    assert any(item.startswith("window.__pwned=") for item in found), found
    assert any('id="pwn"' in item for item in found), found
    assert not watch.refused


def test_no_tenant_string_runs_script_or_adds_markup_on_any_page(page: Page) -> None:
    seeded = seed()
    watch = Watch(page)
    superuser_login(page)
    for path in console_pages(seeded) + admin_pages(seeded):
        response = page.goto(path)
        assert response is not None
        assert response.status == 200, path
        page.wait_for_timeout(50)
        assert injected(page) == [], path
        assert watch.dialogs == [], path
    # Every string was on a page: the hostile token's name, as text.
    page.goto("/console/tokens/")
    expect(page.locator("table")).to_contain_text(BREAKOUT)


def test_every_console_and_admin_page_carries_the_policy(page: Page) -> None:
    seeded = seed()
    watch = Watch(page)
    superuser_login(page)
    for path in ["/console/login/", *console_pages(seeded), *admin_pages(seeded), "/admin/"]:
        response = page.goto(path)
        assert response is not None
        policy = response.headers.get("content-security-policy", "")
        for part in POLICY_PARTS:
            assert part in policy, (path, policy)
        assert response.headers.get("x-frame-options") == "DENY", path
    # Under the policy an inline script a string might smuggle in does not run.
    page.goto("/console/tokens/")
    page.evaluate(
        """() => { const s = document.createElement('script');
                   s.textContent = 'window.__pwned = 9'; document.body.append(s); }"""
    )
    assert page.evaluate("window.__pwned") is None
    assert watch.refused, "Chromium reported no refused inline script"


def test_the_console_works_under_the_policy(page: Page) -> None:
    """The console runs no script of its own: a confirmation is a page of the server's
    (docs/decisions/0114), whose question shows a hostile name as text; nothing the console or the
    admin does is refused by the policy."""
    seeded = seed()
    watch = Watch(page)
    superuser_login(page)
    for path in [*console_pages(seeded), *admin_pages(seeded), "/admin/"]:
        page.goto(path)
    page.goto("/console/tokens/")
    page.locator("form.inline button", has_text="Revoke").first.click()
    question = page.locator("h1")
    expect(question).to_contain_text("Revoke token")
    assert BREAKOUT in question.inner_text() or IN_JS in question.inner_text()
    assert injected(page) == []
    assert ApiToken.objects.filter(revoked_at__isnull=False).count() == 0
    page.click("#confirm")
    expect(page.locator("h1")).to_have_text("API tokens")
    assert ApiToken.objects.filter(revoked_at__isnull=False).count() == 1
    assert watch.dialogs == []
    assert watch.refused == []


def test_a_long_unbroken_string_does_not_widen_a_console_page(page: Page) -> None:
    seeded = seed()
    superuser_login(page)
    for path in console_pages(seeded):
        page.goto(path)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 1280, (path, width)
    page.goto(f"/console/transactions/{seeded['halves'][2].transaction_id}/")
    expect(page.locator("#body")).to_contain_text(LONG)


def test_invisible_characters_in_tenant_strings_are_named_on_console_pages(page: Page) -> None:
    seeded = seed()
    superuser_login(page)
    hostile = seeded["halves"][0].transaction_id
    for path in (
        "/console/tokens/",
        "/console/producer-groups/",
        "/console/transactions/",
        f"/console/transactions/{hostile}/",
    ):
        page.goto(path)
        text = page.evaluate("document.body.innerText")
        hidden = sorted({f"U+{ord(char):04X}" for char in text if char in INVISIBLE})
        assert hidden == [], (path, hidden)
        assert "[U+202E]" in text or "[U+200B]" in text, path
    expect(page.locator("table").first).to_contain_text("order[U+200B]-9527")


class OtherSite:
    """Another origin on this machine (a real server: a page Playwright makes up counts as a
    public site, which Chromium's local network rule stops from framing 127.0.0.1 anyway)."""

    def __init__(self, pages: dict[str, str]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = pages[self.path].encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.base = f"http://localhost:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def test_another_site_cannot_frame_a_console_or_admin_page(page: Page, server: Server) -> None:
    paths = ("/console/login/", "/admin/login/")
    frames = "".join(f'<iframe src="{server.base}{path}"></iframe>' for path in paths)
    # Positive control: a page that allows framing is framed, and its title read.
    frames += '<iframe src="/inner"></iframe>'
    other = OtherSite({"/": frames, "/inner": "<title>framed</title>"})
    try:
        page.goto(other.base + "/")
        page.wait_for_timeout(1000)
        titles = [(frame.url, frame.evaluate("document.title")) for frame in page.frames[1:]]
    finally:
        other.close()
    assert (f"{other.base}/inner", "framed") in titles, titles
    assert len(titles) == 3, titles
    for url, title in titles[:2]:
        assert url.startswith("chrome-error:"), titles
        assert "Log in" not in title, titles
