"""Console pages for topics, groups and tokens, the delayed page, the overview's charts and the
bulk actions: every page for a viewer, every write refused to viewers, done for operators."""

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.broker.models import (
    ApiToken,
    ConsumerGroup,
    Delivery,
    DeliveryState,
    HalfMessage,
    OpRecord,
    ProducerGroup,
    Topic,
    TransactionState,
)
from apps.broker.services import consuming, registry, sending, transactions
from apps.broker.services.sending import OutgoingMessage, message_send
from tests.support.console import login
from tests.support.transactions import PRODUCER

PAGES = [
    "/console/",
    "/console/delayed/",
    "/console/topics/",
    "/console/producer-groups/",
    "/console/consumer-groups/",
    "/console/consumer-groups/billing/",
    "/console/tokens/",
]


@pytest.fixture
def setup(db: None) -> dict[str, Any]:
    topic = registry.topic_create(name="orders", queues=2)
    shop = registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/check")
    billing = registry.consumer_group_create(
        name="billing", max_delivery_attempts=3, consume_from="first"
    )
    token, _ = registry.token_create(name="ci", scopes=["produce:shop"])
    return {"topic": topic, "shop": shop, "billing": billing, "token": token}


def prepare(setup: dict[str, Any], body: bytes = b"x") -> HalfMessage:
    message = OutgoingMessage(producer_group="shop", body=body, body_is_binary=False)
    return transactions.transaction_prepare(
        producer_group=setup["shop"], topic=setup["topic"], message=message, actor=PRODUCER
    )


@pytest.mark.parametrize("path", PAGES)
def test_every_page_is_shown_to_a_viewer_and_sends_anonymous_users_to_login(
    setup: dict[str, Any], path: str
) -> None:
    assert login("txhub-viewers", "vera").get(path).status_code == 200
    anonymous = Client().get(path)
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith("/console/login/")


WRITES = [
    ("/console/topics/new/", {"name": "refunds", "queues": "2"}),
    ("/console/producer-groups/new/", {"name": "pay", "check_url": "http://127.0.0.1:9/c"}),
    ("/console/producer-groups/shop/edit/", {"check_url": "http://127.0.0.1:9/other"}),
    ("/console/producer-groups/shop/rotate-secret/", {}),
    ("/console/producer-groups/shop/test-callback/", {}),
    (
        "/console/consumer-groups/new/",
        {"name": "audit", "max_delivery_attempts": "5", "consume_from": "last"},
    ),
    ("/console/consumer-groups/billing/edit/", {"max_delivery_attempts": "9"}),
    ("/console/consumer-groups/billing/dlq/NOPE/resend/", {}),
    ("/console/tokens/new/", {"name": "new", "scopes": "admin"}),
]

# The writes whose GET is the page that asks before them (docs/decisions/0114).
ASKS_FIRST = {"/console/producer-groups/shop/rotate-secret/"}


@pytest.mark.parametrize(("path", "data"), WRITES)
def test_a_viewer_cannot_change_anything(
    setup: dict[str, Any], path: str, data: dict[str, str]
) -> None:
    before = _snapshot()
    viewer = login("txhub-viewers", "vera")
    assert viewer.post(path, data).status_code == 403
    # Writes are POST only; a GET of one that asks first shows an operator's page (0114).
    assert viewer.get(path).status_code == (403 if path in ASKS_FIRST else 405)
    assert _snapshot() == before


def test_a_token_is_revoked_only_by_an_operator(setup: dict[str, Any]) -> None:
    path = f"/console/tokens/{setup['token'].pk}/revoke/"
    assert login("txhub-viewers", "vera").post(path).status_code == 403
    assert ApiToken.objects.get(pk=setup["token"].pk).revoked_at is None
    assert login("txhub-operators", "otto").post(path).status_code == 302
    assert ApiToken.objects.get(pk=setup["token"].pk).revoked_at is not None


def _snapshot() -> tuple[Any, ...]:
    return (
        list(Topic.objects.values_list("name", "queues").order_by("name")),
        list(ProducerGroup.objects.values_list("name", "check_url", "signing_secret")),
        list(ConsumerGroup.objects.values_list("name", "max_delivery_attempts")),
        list(ApiToken.objects.values_list("name", "revoked_at")),
    )


def test_an_operator_creates_and_edits_topics_groups_and_tokens(setup: dict[str, Any]) -> None:
    otto = login("txhub-operators", "otto")
    for path, data in WRITES[:3] + WRITES[5:7]:
        assert otto.post(path, data).status_code == 302, path
    assert Topic.objects.get(name="refunds").queues == 2
    assert ProducerGroup.objects.get(name="pay").check_url == "http://127.0.0.1:9/c"
    assert ProducerGroup.objects.get(name="shop").check_url == "http://127.0.0.1:9/other"
    assert ConsumerGroup.objects.get(name="audit").consume_from == "last"
    assert ConsumerGroup.objects.get(name="billing").max_delivery_attempts == 9

    created = otto.post(
        "/console/tokens/new/", {"name": "deploy", "scopes": "admin, consume:x"}, follow=True
    )
    page = created.content.decode()
    token = ApiToken.objects.get(name="deploy")
    assert token.scopes == ["admin", "consume:x"]
    raw = re.search(r"Token deploy: (txh_[A-Za-z0-9_-]+)", page)
    assert raw  # the raw token is shown once, on this page, and it is the stored one
    assert registry.hash_token(raw.group(1)) == token.token_hash
    assert raw.group(1) not in otto.get("/console/tokens/").content.decode()


def test_bad_input_is_shown_on_the_form_and_stores_nothing(setup: dict[str, Any]) -> None:
    otto = login("txhub-operators", "otto")
    before = _snapshot()
    for path, data in [
        ("/console/topics/new/", {"name": "orders", "queues": "2"}),  # exists
        ("/console/topics/new/", {"name": "bad name!", "queues": "2"}),
        ("/console/topics/new/", {"name": "many", "queues": "9999"}),
        ("/console/producer-groups/new/", {"name": "p", "check_url": "http://10.1.2.3/c"}),
        ("/console/producer-groups/shop/edit/", {"check_url": "not a url"}),
        (
            "/console/consumer-groups/new/",
            {"name": "g", "max_delivery_attempts": "0", "consume_from": "first"},
        ),
        ("/console/tokens/new/", {"name": "t", "scopes": "root"}),
        ("/console/tokens/new/", {"name": "t", "scopes": ", ,"}),  # no scope at all
    ]:
        response = otto.post(path, data)
        assert response.status_code == 200, (path, data)
        assert 'class="errorlist' in response.content.decode(), (path, data)
    assert _snapshot() == before


def test_rotating_a_secret_shows_the_new_one_once(setup: dict[str, Any]) -> None:
    otto = login("txhub-operators", "otto")
    old = setup["shop"].signing_secret
    page = otto.post("/console/producer-groups/shop/rotate-secret/", follow=True)
    group = ProducerGroup.objects.get(name="shop")
    assert group.signing_secret != old
    assert group.previous_signing_secret == old
    assert group.signing_secret in page.content.decode()
    assert group.signing_secret not in otto.get("/console/producer-groups/").content.decode()


def test_the_test_callback_button_reports_what_the_producer_answered(
    setup: dict[str, Any], checker: Any
) -> None:
    otto = login("txhub-operators", "otto")
    registry.producer_group_update(name="shop", check_url=checker.url)
    checker.answer("UNKNOWN")
    page = otto.post("/console/producer-groups/shop/test-callback/", follow=True).content.decode()
    assert "HTTP 200, answer UNKNOWN" in page
    assert checker.requests
    assert checker.requests[-1]["body"]["test"] is True
    assert not OpRecord.objects.exists()  # a test records and decides nothing

    registry.producer_group_update(name="shop", check_url="http://127.0.0.1:9/down")
    page = otto.post("/console/producer-groups/shop/test-callback/", follow=True).content.decode()
    assert "did not reach it" in page


def test_an_operator_resends_from_the_dead_letter_queue(setup: dict[str, Any]) -> None:
    message = OutgoingMessage(producer_group="shop", body=b"m", body_is_binary=False)
    sent = message_send(topic=setup["topic"], message=message)
    consuming.message_receive(
        group=setup["billing"], topic=setup["topic"], max_messages=1, invisible_seconds=60
    )
    Delivery.objects.update(state=DeliveryState.DLQ, dlq_at=timezone.now())
    otto = login("txhub-operators", "otto")
    page = otto.get("/console/consumer-groups/billing/").content.decode()
    assert sent.msg_id in page
    assert "Resend" in page
    resent = otto.post(f"/console/consumer-groups/billing/dlq/{sent.msg_id}/resend/")
    assert resent.status_code == 302
    assert Delivery.objects.get().state != DeliveryState.DLQ


def test_the_delayed_page_lists_what_waits_and_when(setup: dict[str, Any]) -> None:
    message = OutgoingMessage(producer_group="shop", body=b"m", body_is_binary=False)
    due = timezone.now() + timedelta(hours=2)
    sending.delayed_store(
        topic_id=setup["topic"].pk,
        queue_id=1,
        msg_id="DELAYEDMSG1",
        message=message,
        deliver_at=due,
        born_at=timezone.now(),
    )
    page = login("txhub-viewers", "vera").get("/console/delayed/").content.decode()
    assert "DELAYEDMSG1" in page
    assert timezone.localtime(due).strftime("%Y-%m-%d %H:%M") in page


def test_the_overview_draws_resolutions_per_minute_and_pending_by_age(
    setup: dict[str, Any],
) -> None:
    committed = [prepare(setup) for _ in range(3)]
    for half in committed:
        transactions.transaction_commit(transaction_id=half.transaction_id, actor=PRODUCER)
    rolled_back = prepare(setup)
    transactions.transaction_rollback(transaction_id=rolled_back.transaction_id, actor=PRODUCER)
    old = prepare(setup)
    HalfMessage.objects.filter(pk=old.pk).update(born_at=timezone.now() - timedelta(hours=2))
    prepare(setup)

    page = login("txhub-viewers", "vera").get("/console/").content.decode()

    assert 'data-chart="resolutions-per-minute"' in page
    assert "<title>commits: 3 in all</title>" in page
    assert "<title>rollbacks: 1 in all</title>" in page
    assert 'data-label="&lt;10 s" data-count="1"' in page
    assert 'data-label="1–6 h" data-count="1"' in page


def test_the_overview_makes_a_fixed_number_of_queries(setup: dict[str, Any]) -> None:
    for _ in range(30):
        prepare(setup)
    vera = login("txhub-viewers", "vera")
    with CaptureQueriesContext(connection) as few:
        vera.get("/console/")
    for _ in range(30):
        half = prepare(setup)
        transactions.transaction_commit(transaction_id=half.transaction_id, actor=PRODUCER)
    with CaptureQueriesContext(connection) as many:
        vera.get("/console/")
    assert len(many) == len(few)


def test_bulk_rollback_asks_a_reason_then_rolls_back_each_once(setup: dict[str, Any]) -> None:
    pending = [prepare(setup) for _ in range(3)]
    already = prepare(setup)
    transactions.transaction_commit(transaction_id=already.transaction_id, actor=PRODUCER)
    ids = [str(h.transaction_id) for h in [*pending, already]]
    otto = login("txhub-operators", "otto")

    confirm = otto.post("/console/transactions/bulk/", {"action": "rollback", "ids": ids})
    assert confirm.status_code == 200
    assert "Roll back 4" in confirm.content.decode()
    assert HalfMessage.objects.filter(state=TransactionState.PREPARED).count() == 3  # not yet

    done = otto.post(
        "/console/transactions/bulk/",
        {"action": "rollback", "ids": ids, "reason": "duplicate orders", "confirm": "on"},
        follow=True,
    ).content.decode()
    assert "3 of 4 transactions" in done
    assert "already COMMITTED" in done
    for half in pending:
        half.refresh_from_db()
        assert half.state == TransactionState.ROLLED_BACK
        op = OpRecord.objects.get(half=half, op="ROLLBACK")
        assert (op.actor, op.reason) == ("otto", "duplicate orders")
    already.refresh_from_db()
    assert already.state == TransactionState.COMMITTED


def test_bulk_actions_are_refused_to_viewers_and_need_csrf(setup: dict[str, Any]) -> None:
    half = prepare(setup)
    data = {"action": "commit", "ids": [str(half.transaction_id)], "reason": "r", "confirm": "on"}
    assert (
        login("txhub-viewers", "vera").post("/console/transactions/bulk/", data).status_code == 403
    )
    login("txhub-operators", "otto")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="otto"))
    assert strict.post("/console/transactions/bulk/", data).status_code == 403
    half.refresh_from_db()
    assert half.state == TransactionState.PREPARED
