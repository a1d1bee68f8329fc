"""Deleting a consumer group from the console and the Django admin (docs/decisions/0088): both
call the registry's one deletion (its audit record names the door), only for txhub operators,
the role that edits groups; the admin never runs Django's own cascade nor lists every row it
would reach."""

from django.contrib.auth.models import Group, Permission, User
from django.test import Client

from apps.broker.models import AuditRecord, ConsumerGroup, Delivery, Topic
from apps.broker.services import consuming, registry, sending
from apps.broker.services.sending import OutgoingMessage
from tests.support.console import login


def group_with_deliveries() -> ConsumerGroup:
    topic: Topic = registry.topic_create(name="orders", queues=1)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    group = registry.consumer_group_create(
        name="billing", max_delivery_attempts=16, consume_from="first"
    )
    message = OutgoingMessage("shop", b"x", body_is_binary=False)
    sending.message_send_batch(topic=topic, messages=[(message, None)] * 3)
    consuming.message_receive(group=group, topic=topic, max_messages=3, invisible_seconds=60)
    AuditRecord.objects.all().delete()
    return group


def gone(group: ConsumerGroup) -> bool:
    return (
        not ConsumerGroup.objects.filter(pk=group.pk).exists()
        and not Delivery.objects.filter(group_id=group.pk).exists()
    )


def staff_with(name: str, *codenames: str, operator: bool = False) -> Client:
    user = User.objects.create_user(name, is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    if operator:
        user.groups.add(Group.objects.get_or_create(name="txhub-operators")[0])
    client = Client()
    client.force_login(user)
    return client


# The console -------------------------------------------------------------------------------


def test_an_operator_deletes_a_group_once_its_name_is_typed_again(db: None) -> None:
    group = group_with_deliveries()
    operator = login("txhub-operators", "olga")
    page = operator.get("/console/consumer-groups/billing/")
    assert "/console/consumer-groups/billing/delete/" in page.content.decode()
    asked = operator.get("/console/consumer-groups/billing/delete/")
    assert asked.status_code == 200
    assert "3 message(s) it has not acked (3 in flight)" in asked.content.decode()

    mistyped = operator.post("/console/consumer-groups/billing/delete/", {"confirm": "bill"})
    assert mistyped.status_code == 200
    assert "That is not this group" in mistyped.content.decode()
    assert not gone(group)

    done = operator.post("/console/consumer-groups/billing/delete/", {"confirm": "billing"})
    assert done.status_code == 302
    assert done["Location"] == "/console/consumer-groups/"
    assert gone(group)
    record = AuditRecord.objects.get(action="consumer_group_delete")
    assert (record.target, record.actor, record.door) == ("billing", "olga", "console")
    assert operator.get("/console/consumer-groups/billing/delete/").status_code == 404


def test_a_viewer_can_neither_delete_nor_see_the_way_to(db: None) -> None:
    group = group_with_deliveries()
    viewer = login("txhub-viewers", "vera")
    page = viewer.get("/console/consumer-groups/billing/")
    assert page.status_code == 200
    assert "/delete/" not in page.content.decode()
    assert viewer.get("/console/consumer-groups/billing/delete/").status_code == 403
    posted = viewer.post("/console/consumer-groups/billing/delete/", {"confirm": "billing"})
    assert posted.status_code == 403
    assert not gone(group)
    assert not AuditRecord.objects.exists()


# The Django admin --------------------------------------------------------------------------


def test_the_admins_delete_goes_through_the_service(db: None) -> None:
    group = group_with_deliveries()
    root = Client()
    root.force_login(User.objects.create_superuser("root"))
    url = f"/admin/broker/consumergroup/{group.pk}/delete/"
    asked = root.get(url)
    assert asked.status_code == 200
    text = asked.content.decode()
    assert "with its cursors, deliveries, dead letters and topic bindings" in text
    assert "Delivery" not in text  # not a line per row the cascade would reach
    done = root.post(url, {"post": "yes"})
    assert done.status_code == 302
    assert gone(group)
    record = AuditRecord.objects.get(action="consumer_group_delete")
    assert (record.target, record.actor, record.door) == ("billing", "root", "admin")
    assert record.detail["deliveries"] == {"inflight": 3}


def test_the_admins_delete_needs_djangos_permission_and_the_operator_role(db: None) -> None:
    group = group_with_deliveries()
    url = f"/admin/broker/consumergroup/{group.pk}/delete/"
    not_an_operator = staff_with("pat", "view_consumergroup", "delete_consumergroup")
    no_permission = staff_with("opal", "view_consumergroup", operator=True)
    for client in (not_an_operator, no_permission):
        assert client.post(url, {"post": "yes"}).status_code == 403
    assert not gone(group)
    both = staff_with("otto", "view_consumergroup", "delete_consumergroup", operator=True)
    listing = both.get("/admin/broker/consumergroup/")
    assert "delete_selected" not in listing.content.decode()  # one group at a time
    assert both.post(url, {"post": "yes"}).status_code == 302
    assert gone(group)
