"""Django admin: bulk commit / roll back ask a reason and go through the operator service."""

from django.contrib.auth.models import Group, User
from django.test import Client

from apps.broker.models import HalfMessage, OpRecord, Resolver
from apps.broker.services import registry, transactions
from apps.broker.services.sending import OutgoingMessage
from apps.broker.services.transactions import Actor

PRODUCER = Actor(Resolver.PRODUCER, "test")


def prepared(n: int) -> list[HalfMessage]:
    topic = registry.topic_create(name="orders", queues=1)
    group = registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    message = OutgoingMessage(producer_group="shop", body=b"x", body_is_binary=False)
    return [
        transactions.transaction_prepare(
            producer_group=group, topic=topic, message=message, actor=PRODUCER
        )
        for _ in range(n)
    ]


def test_bulk_rollback_asks_a_reason_then_records_it(db: None) -> None:
    halves = prepared(2)
    client = Client()
    client.force_login(User.objects.create_superuser("root"))
    url = "/admin/broker/halfmessage/"
    selected = {"action": "rollback_selected", "_selected_action": [h.pk for h in halves]}
    asked = client.post(url, selected)
    assert asked.status_code == 200
    assert "reason" in asked.content.decode()
    assert HalfMessage.objects.filter(state="PREPARED").count() == 2
    applied = client.post(url, {**selected, "apply": "1", "reason": "bad batch"})
    assert applied.status_code == 302  # back to the list, as Django's admin does after an action
    assert HalfMessage.objects.filter(state="ROLLED_BACK", resolved_by="OPERATOR").count() == 2
    ops = OpRecord.objects.filter(op="ROLLBACK")
    assert {(o.actor, o.reason) for o in ops} == {("root", "bad batch")}


def test_a_staff_viewer_cannot_act_from_the_admin(db: None) -> None:
    [half] = prepared(1)
    user = User.objects.create_user("vera", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name="txhub-viewers")[0])
    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(codename="view_halfmessage"))
    client = Client()
    client.force_login(user)
    refused = client.post(
        "/admin/broker/halfmessage/",
        {"action": "commit_selected", "_selected_action": [half.pk], "apply": "1", "reason": "x"},
    )
    # Back to the list, told why nothing was done.
    assert refused.status_code == 302
    listing = client.get(refused["Location"])
    assert "Only txhub operators can act." in listing.content.decode()
    assert HalfMessage.objects.get(pk=half.pk).state == "PREPARED"


def test_op_records_are_read_only_in_the_admin(db: None) -> None:
    [half] = prepared(1)
    client = Client()
    client.force_login(User.objects.create_superuser("root"))
    op = OpRecord.objects.get(half=half)
    assert client.get(f"/admin/broker/oprecord/{op.pk}/change/").status_code == 200  # view only
    assert (
        client.post(f"/admin/broker/oprecord/{op.pk}/change/", {"op": "COMMIT"}).status_code == 403
    )
    assert (
        client.post(f"/admin/broker/oprecord/{op.pk}/delete/", {"post": "yes"}).status_code == 403
    )
    assert OpRecord.objects.get(pk=op.pk).op == "PREPARE"
    assert client.get("/admin/broker/halfmessage/").status_code == 200
