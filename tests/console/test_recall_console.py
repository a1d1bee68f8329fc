"""The console shows a recall in the message's history (docs/decisions/0055): the delayed page
lists recalled messages with when, by whom and through which door, and a recalled committed
transaction's page says it was never delivered and why."""

from datetime import timedelta

from django.utils import timezone

from apps.broker import access
from apps.broker.models import HalfMessage
from apps.broker.services import recall, registry, transactions
from tests.support.console import login
from tests.support.transactions import PRODUCER, make_group, prepare


def test_the_console_shows_who_recalled_a_delayed_transaction_when_and_through_which_door(
    db: None,
) -> None:
    topic = registry.topic_create(name="orders", queues=1)
    half: HalfMessage = prepare(make_group(), topic, deliver_at=timezone.now() + timedelta(hours=1))
    transactions.transaction_commit(transaction_id=half.transaction_id, actor=PRODUCER)
    token, _ = registry.token_create(name="order-service-token", scopes=["produce:shop"])
    principal = access.by_id(token.pk)
    assert principal is not None
    recalled = recall.message_recall(msg_id=half.msg_id, principal=principal, door="grpc")

    viewer = login("txhub-viewers", "vera")
    delayed = viewer.get("/console/delayed/").content.decode()
    assert half.msg_id in delayed
    assert "order-service-token" in delayed
    assert "<td>grpc</td>" in delayed
    assert recalled.recalled_at.strftime("%Y-%m-%d %H:%M:%S") in delayed

    detail = viewer.get(f"/console/transactions/{half.transaction_id}/").content.decode()
    assert "never: recalled at" in detail
    assert "by order-service-token through grpc" in detail
