"""Console pages and actions: login, roles enforced on the server, CSRF, audit trail, escaping."""

import uuid

from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from apps.broker.models import HalfMessage, OpRecord
from apps.broker.services import registry, transactions
from apps.broker.services.sending import OutgoingMessage
from tests.support.console import login
from tests.support.transactions import PRODUCER


def test_anonymous_users_are_sent_to_login(half: HalfMessage) -> None:
    for path in (
        "/console/",
        "/console/transactions/",
        f"/console/transactions/{half.transaction_id}/",
    ):
        response = Client().get(path)
        assert response.status_code == 302
        assert response["Location"].startswith("/console/login/")


def test_a_user_without_a_role_is_refused(half: HalfMessage) -> None:
    assert login(None, "nobody").get("/console/transactions/").status_code == 403


def test_a_viewer_sees_everything_and_cannot_act(half: HalfMessage) -> None:
    viewer = login("txhub-viewers", "vera")
    assert viewer.get("/console/").status_code == 200
    listed = viewer.get("/console/transactions/", {"state": "PREPARED"})
    assert str(half.transaction_id) in listed.content.decode()
    detail = viewer.get(f"/console/transactions/{half.transaction_id}/")
    assert detail.status_code == 200
    assert "/commit/" not in detail.content.decode()  # no buttons they cannot use
    action = f"/console/transactions/{half.transaction_id}/commit/"
    assert viewer.get(action).status_code == 403
    assert viewer.post(action, {"reason": "x", "confirm": "on"}).status_code == 403
    half.refresh_from_db()
    assert half.state == "PREPARED"


def test_an_operator_rolls_back_with_a_reason_recorded_in_the_audit_trail(
    half: HalfMessage,
) -> None:
    operator = login("txhub-operators", "olga")
    detail = operator.get(f"/console/transactions/{half.transaction_id}/").content.decode()
    assert "/rollback/" in detail
    action = f"/console/transactions/{half.transaction_id}/rollback/"
    confirm = operator.get(action)
    assert confirm.status_code == 200
    assert "reason" in confirm.content.decode()
    refused = operator.post(action, {"reason": "", "confirm": "on"})
    assert refused.status_code == 200  # the form again: a reason is required
    assert HalfMessage.objects.get(pk=half.pk).state == "PREPARED"
    done = operator.post(action, {"reason": "customer cancelled", "confirm": "on"}, follow=True)
    assert "Rolled back by olga" in done.content.decode()
    half.refresh_from_db()
    assert (half.state, half.resolved_by) == ("ROLLED_BACK", "OPERATOR")
    op = OpRecord.objects.get(half=half, op="ROLLBACK")
    assert (op.source, op.actor, op.reason) == ("OPERATOR", "olga", "customer cancelled")


def test_acting_on_a_resolved_transaction_answers_with_a_message_not_an_error(
    half: HalfMessage,
) -> None:
    transactions.transaction_commit(transaction_id=half.transaction_id, actor=PRODUCER)
    operator = login("txhub-operators", "olga")
    response = operator.post(
        f"/console/transactions/{half.transaction_id}/rollback/",
        {"reason": "too late", "confirm": "on"},
        follow=True,
    )
    assert response.status_code == 200
    assert "Nothing done" in response.content.decode()
    assert OpRecord.objects.filter(half=half, op__in=["COMMIT", "ROLLBACK"]).count() == 1


def test_a_parked_transaction_is_resumed_by_an_operator(half: HalfMessage) -> None:
    transactions.transaction_park(transaction_id=half.transaction_id, actor=PRODUCER, reason="test")
    admin = login("superuser", "root")
    resumed = admin.post(
        f"/console/transactions/{half.transaction_id}/resume/", {"reason": "fixed", "confirm": "on"}
    )
    assert resumed.status_code == 302
    half.refresh_from_db()
    assert half.state == "PREPARED"
    assert half.ops.last().actor == "root"  # type: ignore[union-attr]


def test_actions_need_csrf(half: HalfMessage) -> None:
    user = User.objects.create_superuser("root")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    response = client.post(
        f"/console/transactions/{half.transaction_id}/commit/", {"reason": "x", "confirm": "on"}
    )
    assert response.status_code == 403
    assert HalfMessage.objects.get(pk=half.pk).state == "PREPARED"


def test_a_script_in_a_body_is_shown_escaped(half: HalfMessage) -> None:
    page = (
        login("txhub-viewers", "vera")
        .get(f"/console/transactions/{half.transaction_id}/")
        .content.decode()
    )
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_search_by_key_message_id_and_transaction_id(half: HalfMessage) -> None:
    viewer = login("txhub-viewers", "vera")
    for query in ("9527", half.msg_id.lower(), str(half.transaction_id)):
        page = viewer.get("/console/transactions/", {"query": query}).content.decode()
        assert str(half.transaction_id) in page, query
    assert (
        str(half.transaction_id)
        not in viewer.get("/console/transactions/", {"query": "nope"}).content.decode()
    )


def test_the_list_page_does_not_query_per_row(half: HalfMessage) -> None:
    group, topic = half.producer_group, half.topic
    for _ in range(30):
        transactions.transaction_prepare(
            producer_group=group,
            topic=topic,
            actor=PRODUCER,
            message=OutgoingMessage(producer_group="shop", body=b"x", body_is_binary=False),
        )
    viewer = login("txhub-viewers", "vera")
    with CaptureQueriesContext(connection) as few:
        viewer.get("/console/transactions/")
    with CaptureQueriesContext(connection) as many:
        viewer.get("/console/transactions/", {"order": "-born_at"})
    assert len(few) == len(many)
    assert len(many) <= 8, [q["sql"][:80] for q in many.captured_queries]


def test_a_large_body_is_truncated_with_a_download_link(db: None) -> None:
    topic = registry.topic_create(name="big", queues=1)
    group = registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    half = transactions.transaction_prepare(
        producer_group=group,
        topic=topic,
        actor=PRODUCER,
        message=OutgoingMessage(
            producer_group="shop", body=bytes([1]) * 10000, body_is_binary=True
        ),
    )
    viewer = login("txhub-viewers", "vera")
    page = viewer.get(f"/console/transactions/{half.transaction_id}/").content.decode()
    assert "base64" in page
    assert "Download the whole body" in page
    download = viewer.get(f"/console/transactions/{half.transaction_id}/body")
    assert download.content == bytes([1]) * 10000


def test_a_transaction_that_is_not_there_is_the_consoles_404_on_each_of_its_pages(
    half: HalfMessage,
) -> None:
    """An id that names no transaction (a fresh one, or a stored message's id in a transaction
    id's place) answers the console's not-found page on the detail, body and action pages."""
    otto = login("txhub-operators", "otto")
    stored_message = uuid.UUID(hex=half.msg_id)  # 32 hex characters, as RocketMQ's
    for unknown in (uuid.uuid4(), stored_message):
        for page in ("", "body", "commit/"):
            response = otto.get(f"/console/transactions/{unknown}/{page}")
            assert response.status_code == 404, page
            assert "There is no such" in response.content.decode(), page
    # The positive control: the transaction that is there.
    assert otto.get(f"/console/transactions/{half.transaction_id}/body").status_code == 200
