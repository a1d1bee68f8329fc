"""The console in a real headless Chromium (Debian's, driven by Playwright) against a real
gunicorn: log in, find a pending transaction, roll it back with a reason and see the audit entry;
resume a parked one; the overview's charts render. Screenshots of the main pages are written to
var/screenshots/ (or docs/screenshots/ when TXHUB_SCREENSHOTS=docs, to refresh the README's)."""

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect

from apps.broker.models import HalfMessage, OpRecord, Resolver, TransactionState
from apps.broker.services import registry, transactions
from apps.broker.services.sending import OutgoingMessage
from apps.broker.services.transactions import Actor
from tests.conftest import ROOT, Server

pytestmark = pytest.mark.e2e

SHOTS = ROOT / ("docs" if os.environ.get("TXHUB_SCREENSHOTS") == "docs" else "var") / "screenshots"
PRODUCER = Actor(Resolver.PRODUCER, "shop-service")


def operator_login(page: Page) -> None:
    user = User.objects.create_user("otto", password="otto-pass-9527")
    # get_or_create: transactional tests flush the groups the migration made
    user.groups.add(Group.objects.get_or_create(name="txhub-operators")[0])
    page.goto("/console/")
    page.fill("#id_username", "otto")
    page.fill("#id_password", "otto-pass-9527")
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Overview")


def seed() -> dict[str, Any]:
    topic = registry.topic_create(name="orders", queues=2)
    group = registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/check")

    def prepare(key: str, body: str = '{"order": 9527}') -> HalfMessage:
        message = OutgoingMessage(
            producer_group="shop", body=body.encode(), body_is_binary=False, keys=[key]
        )
        return transactions.transaction_prepare(
            producer_group=group, topic=topic, message=message, actor=PRODUCER
        )

    for i in range(12):
        done = prepare(f"order-{9000 + i}")
        resolve = transactions.transaction_commit if i % 3 else transactions.transaction_rollback
        resolve(transaction_id=done.transaction_id, actor=PRODUCER)
    pending = prepare("order-9527")
    parked = prepare("order-9528")
    transactions.transaction_park(
        transaction_id=parked.transaction_id, actor=Actor(Resolver.SYSTEM, ""), reason="no answer"
    )
    older = prepare("order-9529")
    HalfMessage.objects.filter(pk=older.pk).update(born_at=timezone.now() - timedelta(minutes=20))
    return {"pending": pending, "parked": parked}


def shoot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


def test_an_operator_finds_a_pending_transaction_and_rolls_it_back(page: Page) -> None:
    seeded = seed()
    operator_login(page)
    shoot(page, "overview")

    page.click("text=Transactions")
    page.select_option("#id_state", "PREPARED")
    page.fill("#id_query", "order-9527")
    page.click("form.filters button[type=submit]")
    rows = page.locator("table tbody tr")
    expect(rows).to_have_count(1)
    shoot(page, "transactions")
    page.click(f"text={seeded['pending'].transaction_id}")
    expect(page.locator("#state")).to_have_text("PREPARED")

    page.click("a.button:has-text('Rollback')")
    page.fill("#id_reason", "customer cancelled before payment")
    page.check("#id_confirm")
    page.click("#confirm")

    expect(page.locator("#state")).to_have_text("ROLLED_BACK by OPERATOR")
    audit = page.locator("#timeline tr", has_text="ROLLBACK")
    expect(audit).to_contain_text("OPERATOR (otto)")
    expect(audit).to_contain_text("customer cancelled before payment")
    shoot(page, "transaction-detail")
    op = OpRecord.objects.get(half=seeded["pending"], op="ROLLBACK")
    assert (op.actor, op.reason) == ("otto", "customer cancelled before payment")


def test_a_parked_transaction_is_resumed_from_the_browser(page: Page) -> None:
    seeded = seed()
    operator_login(page)
    page.goto("/console/transactions/?state=PARKED")
    page.click(f"text={seeded['parked'].transaction_id}")
    expect(page.locator("#state")).to_have_text("PARKED")
    page.click("a.button:has-text('Resume')")
    page.fill("#id_reason", "producer fixed, ask again")
    page.check("#id_confirm")
    page.click("#confirm")
    expect(page.locator("#state")).to_have_text("PREPARED")
    expect(page.locator(".messages")).to_contain_text("Resumed")
    seeded["parked"].refresh_from_db()
    assert seeded["parked"].state == TransactionState.PREPARED


def test_the_overview_charts_render(page: Page) -> None:
    seed()
    operator_login(page)
    resolutions = page.locator("svg[data-chart='resolutions-per-minute']")
    expect(resolutions).to_be_visible()
    expect(resolutions.locator("polyline")).to_have_count(3)
    assert resolutions.bounding_box()["height"] > 100  # type: ignore[index]
    bars = page.locator("svg[data-chart='pending-by-age'] rect[data-count]")
    expect(bars).to_have_count(8)
    counts = [int(bars.nth(i).get_attribute("data-count") or "0") for i in range(8)]
    assert sum(counts) == 2  # the pending one and the 20-minute-old one (parked is not pending)
    assert counts[3] == 1  # 5-30 min
    tall = bars.nth(0).bounding_box()
    assert tall is not None
    assert tall["height"] > 20  # drawn, not just present
    shoot(page, "overview")


def test_a_viewer_sees_no_action_buttons_in_the_browser(browser: Browser, server: Server) -> None:
    seeded = seed()
    user = User.objects.create_user("vera", password="vera-pass-9527")
    user.groups.add(Group.objects.get_or_create(name="txhub-viewers")[0])
    context = browser.new_context(base_url=server.base)
    page = context.new_page()
    page.goto("/console/login/")
    page.fill("#id_username", "vera")
    page.fill("#id_password", "vera-pass-9527")
    page.click("button[type=submit]")
    page.goto(f"/console/transactions/{seeded['pending'].transaction_id}/")
    expect(page.locator("#state")).to_have_text("PREPARED")
    expect(page.locator("a.button")).to_have_count(0)
    page.goto("/console/producer-groups/")
    expect(page.locator("text=Rotate secret")).to_have_count(0)
    shoot(page, "producer-groups")
    context.close()
