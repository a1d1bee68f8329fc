"""The console and the admin apply the API's rules: a batch checked as a whole, a token's scopes,
text Postgres cannot store refused with 400, a filter that cannot be read listing nothing, and
one transaction gone meanwhile reported in its own line, never a page that hides what was done."""

import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.broker import limits
from apps.broker.models import ApiToken, HalfMessage, OpRecord, TransactionState
from apps.broker.services import registry, transactions
from apps.broker.services.errors import BrokerError
from apps.broker.services.sending import OutgoingMessage
from tests.support.console import login
from tests.support.transactions import PRODUCER

BULK = "/console/transactions/bulk/"


@pytest.fixture
def shop(db: None) -> dict[str, Any]:
    return {
        "topic": registry.topic_create(name="orders", queues=1),
        "shop": registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/"),
        "other": registry.producer_group_create(name="other", check_url="http://127.0.0.1:9/"),
    }


def prepare(shop: dict[str, Any], group: str = "shop", msg_id: str | None = None) -> HalfMessage:
    message = OutgoingMessage(producer_group=group, body=b"x", body_is_binary=False)
    return transactions.transaction_prepare(
        producer_group=shop[group],
        topic=shop["topic"],
        message=message,
        actor=PRODUCER,
        msg_id=msg_id,
    )


def states(halves: list[HalfMessage]) -> list[str]:
    return [HalfMessage.objects.get(pk=half.pk).state for half in halves]


def test_a_bulk_action_reports_an_unknown_id_and_still_does_the_rest(
    shop: dict[str, Any],
) -> None:
    first, last = prepare(shop), prepare(shop)
    unknown = uuid.uuid4()
    ids = [str(first.transaction_id), str(unknown), str(last.transaction_id)]
    otto = login("txhub-operators", "otto")
    done = otto.post(BULK, {"action": "rollback", "ids": ids, "reason": "r", "confirm": "on"})
    assert done.status_code == 302
    page = otto.get(done["Location"]).content.decode()
    assert "2 of 3 transactions" in page
    assert f"{unknown}: Nothing done:" in page
    assert states([first, last]) == [TransactionState.ROLLED_BACK] * 2


@pytest.mark.parametrize("shape", ["one too many", "an id twice"])
def test_a_bulk_action_outside_the_batch_rule_does_nothing(
    shop: dict[str, Any], shape: str
) -> None:
    halves = [prepare(shop) for _ in range(2)]
    ids = [str(h.transaction_id) for h in halves]
    if shape == "one too many":
        ids += [str(uuid.uuid4()) for _ in range(limits.MAX_BATCH_MESSAGES + 1 - len(ids))]
    else:
        ids.append(ids[0])
    otto = login("txhub-operators", "otto")
    for step in ({}, {"reason": "r", "confirm": "on"}):
        refused = otto.post(BULK, {"action": "rollback", "ids": ids, **step})
        assert refused.status_code == 302
        page = otto.get(refused["Location"]).content.decode()
        assert "A batch has 1 to 64" in page or "may appear once" in page
    assert states(halves) == [TransactionState.PREPARED] * 2
    assert not OpRecord.objects.filter(op="ROLLBACK").exists()


def test_the_admin_refuses_a_bulk_action_over_the_batch_rule(shop: dict[str, Any]) -> None:
    halves = [prepare(shop) for _ in range(limits.MAX_BATCH_MESSAGES + 1)]
    client = Client()
    client.force_login(User.objects.create_superuser("root"))
    chosen = {"action": "rollback_selected", "_selected_action": [h.pk for h in halves]}
    refused = client.post("/admin/broker/halfmessage/", {**chosen, "apply": "1", "reason": "r"})
    assert refused.status_code == 302
    assert "Nothing done: A batch has 1 to 64" in client.get(refused["Location"]).content.decode()
    assert HalfMessage.objects.filter(state=TransactionState.PREPARED).count() == len(halves)
    # Positive control: the same action on a batch the rule allows is done.
    allowed = {**chosen, "_selected_action": [h.pk for h in halves[:2]]}
    client.post("/admin/broker/halfmessage/", {**allowed, "apply": "1", "reason": "r"})
    assert states(halves[:2]) == [TransactionState.ROLLED_BACK] * 2


def test_a_token_has_at_most_the_apis_scopes_at_every_door(shop: dict[str, Any]) -> None:
    too_many = [f"consume:g{i}" for i in range(limits.MAX_SCOPES + 1)]
    before = ApiToken.objects.count()
    otto = login("txhub-operators", "otto")
    form = otto.post("/console/tokens/new/", {"name": "many", "scopes": " ".join(too_many)})
    assert form.status_code == 200
    assert "A token has 1 to 100 scopes." in form.content.decode()
    with pytest.raises(BrokerError, match="1 to 100 scopes"):
        registry.token_create(name="many", scopes=too_many)
    with pytest.raises(BrokerError, match="A scope is"):
        registry.token_create(name="odd", scopes=["consume:a b"])
    assert ApiToken.objects.count() == before
    # Positive control: the most the rule allows is made.
    registry.token_create(name="most", scopes=too_many[:-1])
    assert ApiToken.objects.count() == before + 1


@pytest.mark.parametrize(
    "path",
    [
        "/admin/broker/halfmessage/?state__exact=a%00b",
        "/admin/broker/halfmessage/?resolved_by__exact=%00",
        "/admin/broker/auditrecord/?action__exact=a%00",
        "/admin/broker/oprecord/?op__exact=%00",
        "/console/transactions/?query=a%00b",
        "/console/transactions/?a%00=1",
    ],
)
def test_a_nul_in_a_pages_query_is_a_400(db: None, path: str) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("root"))
    refused = client.get(path)
    assert refused.status_code == 400
    assert b"NUL characters" in refused.content
    # Positive control: the same page without the NUL answers.
    assert client.get(path.replace("%00", "")).status_code == 200


def test_a_filter_that_cannot_be_read_lists_nothing(shop: dict[str, Any]) -> None:
    prepare(shop)
    prepare(shop, group="other")
    otto = login("txhub-operators", "otto")
    good = otto.get("/console/transactions/?producer_group=shop").content.decode()
    assert "1 in all" in good  # positive control
    bad = otto.get("/console/transactions/?producer_group=shop&older_than_seconds=-5")
    assert bad.status_code == 200
    page = bad.content.decode()
    assert "0 in all" in page
    assert "errorlist" in page


def test_the_console_finds_a_clients_own_id_as_it_was_given(shop: dict[str, Any]) -> None:
    lower = prepare(shop, msg_id="clientLowerId1")
    ours = prepare(shop)
    otto = login("txhub-operators", "otto")
    for query, half in (("clientLowerId1", lower), (ours.msg_id.lower(), ours)):
        page = otto.get(f"/console/transactions/?query={query}").content.decode()
        assert "1 in all" in page
        assert str(half.transaction_id) in page
