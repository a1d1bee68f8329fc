"""A check URL's credentials are shown only to who may change the URL (docs/decisions/0079):
console viewers and admin staff who are not txhub operators see it masked as the audit records
it; operators and superusers see it whole, and their edit form keeps it whole."""

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.test import Client

from apps.broker.models import AuditRecord, ProducerGroup
from apps.broker.services import registry
from tests.support.console import login

SECRET_URL = "http://shop:hunter2@127.0.0.1:9/check?key=s3cret"
MASKED_URL = "http://shop:***@127.0.0.1:9/check?***"
SECRETS = ("hunter2", "s3cret")


@pytest.fixture
def shop(db: None) -> ProducerGroup:
    return registry.producer_group_create(name="shop", check_url=SECRET_URL)


def shown(client: Client, path: str) -> str:
    page = client.get(path)
    assert page.status_code == 200
    return page.content.decode()


def test_a_viewer_sees_the_check_url_masked_on_the_producer_groups_page(
    shop: ProducerGroup,
) -> None:
    page = shown(login("txhub-viewers", "vera"), "/console/producer-groups/")
    assert MASKED_URL in page
    assert not any(secret in page for secret in SECRETS)


@pytest.mark.parametrize("role", ["txhub-operators", "superuser"])
def test_who_may_change_the_check_url_sees_it_whole_in_the_edit_form(
    shop: ProducerGroup, role: str
) -> None:
    page = shown(login(role, "otto"), "/console/producer-groups/")
    assert f'name="check_url" value="{SECRET_URL}"' in page
    assert MASKED_URL not in page


def test_saving_the_edit_form_untouched_keeps_the_credentials(shop: ProducerGroup) -> None:
    otto = login("txhub-operators", "otto")
    page = shown(otto, "/console/producer-groups/")
    # The form's value as the page shows it, posted back unchanged.
    value = page.split('name="check_url" value="', 1)[1].split('"', 1)[0]
    saved = otto.post("/console/producer-groups/shop/edit/", {"check_url": value})
    assert saved.status_code == 302
    assert ProducerGroup.objects.get(name="shop").check_url == SECRET_URL
    assert not AuditRecord.objects.exists()  # the same URL again is no change (decision 0039)


def test_a_viewer_cannot_trigger_the_test_callback_whose_message_names_the_url(
    shop: ProducerGroup,
) -> None:
    vera = login("txhub-viewers", "vera")
    assert vera.post("/console/producer-groups/shop/test-callback/").status_code == 403


def test_the_test_callback_message_shows_the_operator_the_url_whole(shop: ProducerGroup) -> None:
    otto = login("txhub-operators", "otto")
    page = otto.post("/console/producer-groups/shop/test-callback/", follow=True).content.decode()
    assert f"Test callback to {SECRET_URL} did not reach it" in page


def test_the_audit_records_the_change_masked_as_before(shop: ProducerGroup) -> None:
    otto = login("txhub-operators", "otto")
    new = "http://shop:hunter3@127.0.0.1:9/check?key=other"
    assert otto.post("/console/producer-groups/shop/edit/", {"check_url": new}).status_code == 302
    record = AuditRecord.objects.get()
    assert record.detail == {"old": MASKED_URL, "new": "http://shop:***@127.0.0.1:9/check?***"}


# The Django admin: read-only for everyone; the URL whole only to txhub operators.


def admin_staff(name: str, *, operator: bool) -> Client:
    user = User.objects.create_user(name, is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_producergroup"))
    role = "txhub-operators" if operator else "txhub-viewers"
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    client = Client()
    client.force_login(user)
    return client


def admin_pages(group: ProducerGroup) -> list[str]:
    return ["/admin/broker/producergroup/", f"/admin/broker/producergroup/{group.pk}/change/"]


def test_an_admin_staff_viewer_sees_the_check_url_masked(shop: ProducerGroup) -> None:
    client = admin_staff("vic", operator=False)
    for path in admin_pages(shop):
        page = shown(client, path)
        assert MASKED_URL in page, path
        assert not any(secret in page for secret in SECRETS), path


@pytest.mark.parametrize("who", ["operator", "superuser"])
def test_an_admin_user_who_may_change_it_sees_the_check_url_whole(
    shop: ProducerGroup, who: str
) -> None:
    if who == "superuser":
        client = Client()
        client.force_login(User.objects.create_superuser("root"))
    else:
        client = admin_staff("opal", operator=True)
    for path in admin_pages(shop):
        assert SECRET_URL in shown(client, path), path


def test_a_check_url_without_credentials_is_shown_as_it_is(db: None) -> None:
    registry.producer_group_create(name="plain", check_url="http://127.0.0.1:9/check")
    page: Any = shown(login("txhub-viewers", "vera"), "/console/producer-groups/")
    assert "<code>http://127.0.0.1:9/check</code>" in page


def test_no_template_shows_a_check_url_but_through_the_rule() -> None:
    """A page shows what producer_group_check_url_shown gave its view, never the field."""
    templates = Path(__file__).resolve().parents[2] / "templates"
    showing = [p.name for p in templates.rglob("*.html") if ".check_url" in p.read_text()]
    assert showing == []
