"""The tokens page tells a revocation scheduled for later ("revokes at ...", the token still
works) from one that has happened (its date), by the rule the revocation itself asks
(access.not_revoked_by; docs/decisions/0108 and 0114)."""

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from apps.broker.models import ApiToken
from apps.broker.services import registry
from tests.support.console import login


def revoked_cell(page: str, token: ApiToken) -> str:
    """The text of the token's "revoked" cell: the sixth of its row, the fifth after its id."""
    row = page.split(f"<tr><td>{token.pk}</td>", 1)[1].split("</tr>", 1)[0]
    return row.split("<td>")[5].split("</td>", 1)[0]


def test_a_revocation_to_come_reads_revokes_at_and_a_past_one_its_date(db: None) -> None:
    live, _ = registry.token_create(name="live", scopes=["admin"])
    spent, _ = registry.token_create(name="spent", scopes=["admin"])
    later, _ = registry.token_create(name="later", scopes=["admin"])
    registry.token_revoke(token_id=spent.pk)
    at = timezone.now() + timedelta(hours=2)
    ApiToken.objects.filter(pk=later.pk).update(revoked_at=at)
    spent.refresh_from_db()
    assert spent.revoked_at is not None
    for role in ("txhub-viewers", "txhub-operators"):
        page = login(role, role).get(reverse("console:tokens")).content.decode()
        assert revoked_cell(page, live) == "–"
        assert revoked_cell(page, spent) == spent.revoked_at.strftime("%Y-%m-%d %H:%M")
        assert revoked_cell(page, later) == f"revokes at {at.strftime('%Y-%m-%d %H:%M')}"
