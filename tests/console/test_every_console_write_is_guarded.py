"""Every console URL is classified, and every one that changes something (or is an operator's)
is refused to a viewer whatever the method, and refused to an operator's cross-site form post
(no CSRF token, another site's Origin). Session and CSRF cookies keep their flags. A new console
URL fails the first test until it is classified here (docs/decisions/0092)."""

from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, reverse

from apps.broker.models import ApiToken, ConsumerGroup, HalfMessage, ProducerGroup, Topic
from apps.broker.services import registry, transactions
from apps.broker.services.sending import OutgoingMessage
from apps.console import urls as console_urls
from tests.support.console import login
from tests.support.transactions import PRODUCER

# Pages any console user may read (and the session's own two).
READS = {
    "overview",
    "transactions",
    "delayed",
    "reconciliations",
    "reconciliation",
    "topics",
    "producer-groups",
    "consumer-groups",
    "consumer-group",
    "tokens",
    "transaction-detail",
    "transaction-body",
}
SESSION = {"login", "logout"}


@pytest.fixture
def setup(db: None) -> dict[str, Any]:
    topic = registry.topic_create(name="orders", queues=1)
    shop = registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/check")
    registry.consumer_group_create(name="billing", max_delivery_attempts=3, consume_from="first")
    token, _ = registry.token_create(name="ci", scopes=["produce:shop"])
    message = OutgoingMessage(producer_group="shop", body=b"{}", body_is_binary=False)
    half = transactions.transaction_prepare(
        producer_group=shop, topic=topic, message=message, actor=PRODUCER
    )
    return {"token": token, "half": half}


def operator_urls(setup: dict[str, Any]) -> dict[str, tuple[str, dict[str, str]]]:
    """Each operator's URL, with a form that would be accepted from an operator."""
    transaction_id = setup["half"].transaction_id
    return {
        "transactions-bulk": (
            reverse("console:transactions-bulk"),
            {"ids": str(transaction_id), "action": "commit", "reason": "r", "confirm": "on"},
        ),
        "audit": (reverse("console:audit"), {}),
        "topic-create": (reverse("console:topic-create"), {"name": "refunds", "queues": "1"}),
        "producer-group-create": (
            reverse("console:producer-group-create"),
            {"name": "pay", "check_url": "http://127.0.0.1:9/c"},
        ),
        "producer-group-edit": (
            reverse("console:producer-group-edit", args=["shop"]),
            {"check_url": "http://127.0.0.1:9/other"},
        ),
        "producer-group-topics": (
            reverse("console:producer-group-topics", args=["shop"]),
            {"topics": "orders"},
        ),
        "producer-group-rotate": (reverse("console:producer-group-rotate", args=["shop"]), {}),
        "producer-group-test": (reverse("console:producer-group-test", args=["shop"]), {}),
        "consumer-group-create": (
            reverse("console:consumer-group-create"),
            {"name": "audit", "max_delivery_attempts": "5", "consume_from": "last"},
        ),
        "consumer-group-edit": (
            reverse("console:consumer-group-edit", args=["billing"]),
            {"max_delivery_attempts": "9"},
        ),
        "consumer-group-delete": (
            reverse("console:consumer-group-delete", args=["billing"]),
            {"name": "billing", "confirm": "on"},
        ),
        "consumer-group-topics": (
            reverse("console:consumer-group-topics", args=["billing"]),
            {"topics": "orders"},
        ),
        "dlq-resend": (reverse("console:dlq-resend", args=["billing", "NOPE"]), {}),
        "token-create": (reverse("console:token-create"), {"name": "new", "scopes": "admin"}),
        "token-revoke": (reverse("console:token-revoke", args=[setup["token"].pk]), {}),
        "transaction-action": (
            reverse("console:transaction-action", args=[transaction_id, "commit"]),
            {"reason": "r", "confirm": "on"},
        ),
    }


def snapshot() -> tuple[Any, ...]:
    return (
        list(Topic.objects.values_list("name", "queues").order_by("name")),
        list(ProducerGroup.objects.values_list("name", "check_url", "signing_secret")),
        list(ConsumerGroup.objects.values_list("name", "max_delivery_attempts").order_by("name")),
        list(ApiToken.objects.values_list("name", "revoked_at").order_by("name")),
        list(HalfMessage.objects.values_list("state", flat=True)),
    )


def test_every_console_url_is_classified(setup: dict[str, Any]) -> None:
    names = {p.name for p in console_urls.urlpatterns if isinstance(p, URLPattern)}
    assert names == READS | SESSION | set(operator_urls(setup))


def test_a_viewer_reaches_no_operator_url_by_any_method(setup: dict[str, Any]) -> None:
    before = snapshot()
    viewer = login("txhub-viewers", "vera")
    for name, (path, data) in operator_urls(setup).items():
        for method in (viewer.get, viewer.post, viewer.put, viewer.delete):
            status = method(path, data).status_code
            assert status in {403, 405}, (name, method.__name__, status)
    assert snapshot() == before


def test_an_operators_cross_site_form_post_is_refused(setup: dict[str, Any]) -> None:
    before = snapshot()
    operator = login("txhub-operators", "otto")
    operator.handler.enforce_csrf_checks = True
    for name, (path, data) in operator_urls(setup).items():
        response = operator.post(path, data, headers={"Origin": "https://evil.example"})
        assert response.status_code == 403, name
    assert snapshot() == before
    # Positive control: the same operator, with the token the page gave, may revoke.
    operator.get(reverse("console:tokens"))
    path, data = operator_urls(setup)["token-revoke"]
    token = operator.cookies[settings.CSRF_COOKIE_NAME].value
    assert operator.post(path, {**data, "csrfmiddlewaretoken": token}).status_code == 302
    assert ApiToken.objects.get(pk=setup["token"].pk).revoked_at is not None


def test_the_session_and_csrf_cookies_keep_their_flags(db: None) -> None:
    client = Client(enforce_csrf_checks=True)
    client.get(reverse("console:login"))
    csrf = client.cookies[settings.CSRF_COOKIE_NAME]
    assert csrf["samesite"] == "Lax"
    User.objects.create_superuser("root", password="root-pass-9527")
    form = {"username": "root", "password": "root-pass-9527", "csrfmiddlewaretoken": csrf.value}
    assert client.post(reverse("console:login"), form).status_code == 302
    session = client.cookies[settings.SESSION_COOKIE_NAME]
    assert session["httponly"] is True
    assert session["samesite"] == "Lax"
