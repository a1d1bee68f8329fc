"""The console's audited actions record door "console" and the operator's user name; the audit
page shows the records, newest first, to operators and superusers only (docs/decisions/0039)."""

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from apps.broker.models import ApiToken, AuditRecord, Delivery, DeliveryState, ProducerGroup
from apps.broker.services import consuming, registry
from apps.broker.services.sending import OutgoingMessage, message_send
from tests.support.console import login

FROM = "198.51.100.9"  # TEST-NET-2: the address the browser claims to come from


@pytest.fixture
def setup(db: None) -> dict[str, Any]:
    topic = registry.topic_create(name="orders", queues=1)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/check")
    billing = registry.consumer_group_create(
        name="billing", max_delivery_attempts=3, consume_from="first"
    )
    message = OutgoingMessage(producer_group="shop", body=b"m", body_is_binary=False)
    sent = message_send(topic=topic, message=message)
    consuming.message_receive(group=billing, topic=topic, max_messages=1, invisible_seconds=60)
    Delivery.objects.update(state=DeliveryState.DLQ, dlq_at=timezone.now())
    token, _ = registry.token_create(name="ci", scopes=["produce:shop"])
    AuditRecord.objects.all().delete()  # the setup's own token was recorded as "system"
    return {"token": token, "msg_id": sent.msg_id}


def test_each_console_action_records_door_console_and_the_operators_user_name(
    setup: dict[str, Any],
) -> None:
    otto = login("txhub-operators", "otto")
    for path, data in [
        ("/console/tokens/new/", {"name": "deploy", "scopes": "admin"}),
        (f"/console/tokens/{setup['token'].pk}/revoke/", {}),
        ("/console/producer-groups/shop/edit/", {"check_url": "http://127.0.0.1:9/other"}),
        ("/console/producer-groups/shop/rotate-secret/", {}),
        ("/console/producer-groups/shop/topics/", {"topics": "orders"}),
        ("/console/consumer-groups/billing/topics/", {"topics": "orders"}),
        (f"/console/consumer-groups/billing/dlq/{setup['msg_id']}/resend/", {}),
    ]:
        assert otto.post(path, data, REMOTE_ADDR=FROM).status_code == 302, path
    records = list(AuditRecord.objects.order_by("id"))
    assert [(r.action, r.target) for r in records] == [
        ("token_create", "deploy"),
        ("token_revoke", "ci"),
        ("check_url_change", "shop"),
        ("secret_rotate", "shop"),
        ("topic_bindings_change", "shop"),
        ("topic_bindings_change", "billing"),
        ("dlq_resend", "billing"),
    ]
    for record in records:
        assert (record.actor, record.actor_kind, record.door, record.address) == (
            "otto",
            "operator",
            "console",
            FROM,
        )


def test_a_refused_console_action_records_nothing(setup: dict[str, Any]) -> None:
    otto = login("txhub-operators", "otto")
    assert otto.post("/console/tokens/999999/revoke/").status_code == 302  # "does not exist"
    assert otto.post("/console/producer-groups/shop/edit/", {"check_url": "x"}).status_code == 200
    assert otto.post("/console/consumer-groups/billing/dlq/NOPE/resend/").status_code == 302
    vera = login("txhub-viewers", "vera")
    assert vera.post(f"/console/tokens/{setup['token'].pk}/revoke/").status_code == 403
    assert not AuditRecord.objects.exists()


def test_no_secret_shown_in_the_console_is_recorded(setup: dict[str, Any]) -> None:
    otto = login("txhub-operators", "otto")
    created = otto.post(
        "/console/tokens/new/", {"name": "deploy", "scopes": "admin"}, follow=True
    ).content.decode()
    raw = re.search(r"Token deploy: (txh_[A-Za-z0-9_-]+)", created)
    secret_key = re.search(r"secret key (\S+)", created)
    assert raw
    assert secret_key
    otto.post("/console/producer-groups/shop/rotate-secret/", follow=True)  # shown once
    group = ProducerGroup.objects.get(name="shop")
    everything = str(list(AuditRecord.objects.values()))
    assert AuditRecord.objects.count() == 2
    for secret in (
        raw.group(1),
        ApiToken.objects.get(name="deploy").token_hash,
        secret_key.group(1),
        group.signing_secret,
        group.previous_signing_secret,
    ):
        assert secret not in everything
    page = otto.get("/console/audit/").content.decode()
    assert raw.group(1) not in page
    assert group.signing_secret not in page


def test_the_audit_page_shows_an_operator_who_did_what_newest_first(
    setup: dict[str, Any],
) -> None:
    otto = login("txhub-operators", "otto")
    otto.post("/console/producer-groups/shop/topics/", {"topics": "orders"}, REMOTE_ADDR=FROM)
    otto.post(f"/console/tokens/{setup['token'].pk}/revoke/", REMOTE_ADDR=FROM)
    page = otto.get("/console/audit/")
    assert page.status_code == 200
    text = page.content.decode()
    revoke, bind = text.index("token_revoke"), text.index("topic_bindings_change")
    assert revoke < bind  # newest first
    for shown in ("otto", "operator", "console", FROM, "shop", "ci", "new: orders", "old: none"):
        assert shown in text, shown
    assert f'href="{reverse("console:audit")}"' in text  # the navigation links to it


def test_the_audit_page_is_paginated(setup: dict[str, Any]) -> None:
    start = timezone.now() - timedelta(days=1)
    AuditRecord.objects.bulk_create(
        AuditRecord(
            at=start + timedelta(minutes=n),
            actor="seed",
            actor_kind="system",
            action="secret_rotate",
            target=f"group-{n:03d}",
            door="system",
        )
        for n in range(60)
    )
    admin = User.objects.create_superuser("root")
    client = Client()
    client.force_login(admin)
    first = client.get("/console/audit/").content.decode()
    assert "group-059" in first
    assert "group-010" in first
    assert "group-009" not in first
    assert "60 in all" in first
    second = client.get("/console/audit/?page=2").content.decode()
    assert "group-009" in second
    assert "group-010" not in second


def test_the_audit_page_and_its_link_are_refused_to_a_viewer(setup: dict[str, Any]) -> None:
    vera = login("txhub-viewers", "vera")
    assert vera.get("/console/audit/").status_code == 403
    assert 'href="/console/audit/"' not in vera.get("/console/").content.decode()
    anonymous = Client().get("/console/audit/")
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith("/console/login/")


def test_the_django_admin_shows_the_audit_record_read_only(setup: dict[str, Any]) -> None:
    registry.producer_group_rotate_secret(name="shop")
    record = AuditRecord.objects.get()
    admin = User.objects.create_superuser("root")
    client = Client()
    client.force_login(admin)
    assert client.get("/admin/broker/auditrecord/").status_code == 200
    assert client.get("/admin/broker/auditrecord/add/").status_code == 403
    change = client.get(f"/admin/broker/auditrecord/{record.pk}/change/")
    assert change.status_code == 200
    assert 'name="_save"' not in change.content.decode()  # a view page, no save button
    assert client.post(f"/admin/broker/auditrecord/{record.pk}/delete/").status_code == 403
    assert AuditRecord.objects.filter(pk=record.pk).exists()


def test_a_token_scheduled_for_revocation_can_be_revoked_now(setup: dict[str, Any]) -> None:
    """Its row offers the Revoke form, as a live token's does, and revoking it holds at once;
    a revoked token's row offers none (decision 0108)."""
    token = setup["token"]
    spent, _ = registry.token_create(name="spent", scopes=["produce:shop"])
    registry.token_revoke(token_id=spent.pk)
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now() + timedelta(hours=1))
    otto = login("txhub-operators", "otto")
    page = otto.get(reverse("console:tokens")).content.decode()
    assert reverse("console:token-revoke", args=[token.pk]) in page
    assert reverse("console:token-revoke", args=[spent.pk]) not in page
    otto.post(reverse("console:token-revoke", args=[token.pk]))
    revoked_at = ApiToken.objects.get(pk=token.pk).revoked_at
    assert revoked_at is not None
    assert revoked_at <= timezone.now()
    assert AuditRecord.objects.filter(action="token_revoke", target="ci").count() == 1
    page = otto.get(reverse("console:tokens")).content.decode()
    assert reverse("console:token-revoke", args=[token.pk]) not in page
