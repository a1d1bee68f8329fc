"""The Django admin names the invisible characters of tenants' strings as the console does
(docs/decisions/0092, 0103): a token named "invoice", U+202E, "fdp.exe" must not read
"invoiceexe.pdf" on any list, detail, history or delete page, in a page's title, a message or the
recent actions."""

import re

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from apps.broker.models import (
    ActorKind,
    ApiToken,
    AuditRecord,
    CommitLogEntry,
    ConsumerGroup,
    Door,
    HalfMessage,
    OpRecord,
    Resolver,
)
from apps.broker.services import registry, transactions
from apps.broker.services.audit import Origin
from apps.broker.services.sending import OutgoingMessage
from apps.broker.services.transactions import Actor
from apps.console.invisible import INVISIBLE_RE

SPOOF = "invoice\u202efdp.exe"  # reads "invoiceexe.pdf"
LOOKALIKE = "order\u200b-9527"  # looks like "order-9527"
NAMED = "invoice[U+202E]fdp.exe"
PRODUCER = Actor(Resolver.PRODUCER, "shop-service")


def seed() -> dict[str, object]:
    topic = registry.topic_create(name="orders", queues=1)
    group = registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    spoofer = Origin(SPOOF, ActorKind.TOKEN, Door.REST, "127.0.0.1")
    token, _ = registry.token_create(name=SPOOF, scopes=["produce:shop"], origin=spoofer)

    def prepare() -> HalfMessage:
        message = OutgoingMessage(
            producer_group="shop",
            body=b"{}",
            body_is_binary=False,
            tags=SPOOF,
            keys=[SPOOF, LOOKALIKE],
            properties={LOOKALIKE: SPOOF},
            message_group=SPOOF,
        )
        return transactions.transaction_prepare(
            producer_group=group, topic=topic, message=message, actor=PRODUCER
        )

    parked = prepare()
    transactions.transaction_park(
        transaction_id=parked.transaction_id, actor=Actor(Resolver.SYSTEM, SPOOF), reason=SPOOF
    )
    committed = prepare()
    transactions.transaction_commit(
        transaction_id=committed.transaction_id, actor=PRODUCER, reason=SPOOF
    )
    return {
        "halfmessage": parked.pk,
        "oprecord": OpRecord.objects.filter(half=parked).latest("at").pk,
        "apitoken": token.pk,
        "auditrecord": AuditRecord.objects.get(target=SPOOF).pk,
        "commitlogentry": CommitLogEntry.objects.get(transaction_id=committed.transaction_id).pk,
    }


def shown_text(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, url
    return response.content.decode()


def test_the_admin_names_invisible_characters_on_list_and_detail_pages(db: None) -> None:
    rows = seed()
    client = Client()
    client.force_login(User.objects.create_superuser("root"))
    for model, pk in rows.items():
        detail = reverse(f"admin:broker_{model}_change", args=[pk])
        for url in (reverse(f"admin:broker_{model}_changelist"), detail):
            page = shown_text(client, url)
            hidden = sorted({f"U+{ord(char):04X}" for char in INVISIBLE_RE.findall(page)})
            assert hidden == [], (url, hidden)
            # The lists of transactions and of stored messages show no tenant's string.
            if url == detail or model in ("oprecord", "apitoken", "auditrecord"):
                assert "[U+202E]" in page, url
    token_page = shown_text(
        client, reverse("admin:broker_apitoken_change", args=[rows["apitoken"]])
    )
    assert re.search(rf"<title>{re.escape(NAMED)}", token_page), "the page's title"
    half_page = shown_text(
        client, reverse("admin:broker_halfmessage_change", args=[rows["halfmessage"]])
    )
    assert "order[U+200B]-9527" in half_page


def assert_named(page: str, url: str, *named: str) -> None:
    hidden = sorted({f"U+{ord(char):04X}" for char in INVISIBLE_RE.findall(page)})
    assert hidden == [], (url, hidden)
    for text in named:
        assert text in page, (url, text)


def test_the_admins_history_pages_name_invisible_characters(db: None) -> None:
    """The object's name in the history page's title, heading and breadcrumbs, and its log
    entries' messages (docs/decisions/0103)."""
    rows = seed()
    root = User.objects.create_superuser("root")
    client = Client()
    client.force_login(root)
    # The admin writes no entry for these read-only rows; one as Django's admin writes them.
    token = ApiToken.objects.get(name=SPOOF)
    LogEntry.objects.log_actions(
        user_id=root.pk, queryset=[token], action_flag=CHANGE, change_message=f"Renamed {SPOOF}"
    )
    for model, pk in rows.items():
        url = reverse(f"admin:broker_{model}_history", args=[pk])
        page = shown_text(client, url)
        assert_named(page, url)
    url = reverse("admin:broker_apitoken_history", args=[rows["apitoken"]])
    page = shown_text(client, url)
    assert re.search(rf"<title>Change history: {re.escape(NAMED)}", page), "the page's title"
    assert f"<td>Renamed {NAMED}</td>" in page, "the entry's message"
    url = reverse("admin:broker_auditrecord_history", args=[rows["auditrecord"]])
    assert_named(shown_text(client, url), url, f"by {NAMED}")


def test_the_admins_delete_page_message_and_recent_actions_name_invisible_characters(
    db: None,
) -> None:
    """A consumer group with a zero-width joiner in its name: no door makes one (check_name), so
    it is written with the ORM, as a row from elsewhere would be (docs/decisions/0103)."""
    group = ConsumerGroup.objects.create(name="pay\u200dments", max_delivery_attempts=3)
    client = Client()
    client.force_login(User.objects.create_superuser("root"))
    url = reverse("admin:broker_consumergroup_delete", args=[group.pk])
    page = shown_text(client, url)
    assert_named(page, url, '"pay[U+200D]ments"', "Consumer group: pay[U+200D]ments, with")
    deleted = client.post(url, {"post": "yes"}, follow=True)
    assert not ConsumerGroup.objects.filter(pk=group.pk).exists()
    assert_named(deleted.content.decode(), "after", "group “pay[U+200D]ments” was deleted")
    index = shown_text(client, reverse("admin:index"))
    sidebar = index[index.index('id="recent-actions-module"') :]
    assert_named(sidebar, "the recent actions", "pay[U+200D]ments")
