"""The admin's tokens list and a token's page tell a revocation scheduled for later ("revokes at"
its time, the token still works) from one that has happened (its time), by the rule the
revocation itself asks, as the console's tokens page does (access.not_revoked_by; decisions 0108
and 0114)."""

import re
from datetime import datetime, timedelta

from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import formats, timezone

from apps.broker.models import ApiToken
from apps.broker.services import registry


def shown(moment: datetime) -> str:
    """A time as the admin shows a date-time field."""
    return str(formats.localize(timezone.localtime(moment)))


def revoked_cell(page: str, token: ApiToken) -> str:
    """The text of the token's "revoked at" cell in the admin's list."""
    row = page.split(f"/admin/broker/apitoken/{token.pk}/change/", 1)[1].split("</tr>", 1)[0]
    found = re.search(r'<td class="field-revoked_at[^"]*">(.*?)</td>', row)
    assert found is not None, row
    return found.group(1)


def test_a_revocation_to_come_reads_revokes_at_and_a_past_one_its_time(db: None) -> None:
    live, _ = registry.token_create(name="live", scopes=["admin"])
    spent, _ = registry.token_create(name="spent", scopes=["admin"])
    later, _ = registry.token_create(name="later", scopes=["admin"])
    registry.token_revoke(token_id=spent.pk)
    at = timezone.now() + timedelta(hours=2)
    ApiToken.objects.filter(pk=later.pk).update(revoked_at=at)
    spent.refresh_from_db()
    assert spent.revoked_at is not None
    client = Client()
    client.force_login(User.objects.create_superuser("root"))

    page = client.get(reverse("admin:broker_apitoken_changelist")).content.decode()
    assert revoked_cell(page, live) == "-"
    assert revoked_cell(page, spent) == shown(spent.revoked_at)
    assert revoked_cell(page, later) == f"revokes at {shown(at)}"

    def detail(token: ApiToken) -> str:
        url = reverse("admin:broker_apitoken_change", args=[token.pk])
        return client.get(url).content.decode()

    assert f"revokes at {shown(at)}" in detail(later)
    assert shown(spent.revoked_at) in detail(spent)
    assert "revokes at" not in detail(spent)
