"""The console and the admin with a FIFO consumer group: set at creation, and its page shows the
message groups held behind an unacked message (issue 29, docs/decisions/0054)."""

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.broker.models import ConsumerGroup, Topic
from apps.broker.services import consuming, registry, sending
from apps.broker.services.sending import OutgoingMessage
from tests.support.console import login


def send(group: str, body: str) -> None:
    message = OutgoingMessage(
        producer_group="shop", body=body.encode(), body_is_binary=False, message_group=group
    )
    sending.message_send(topic=_orders(), message=message)


def _orders() -> Topic:
    return Topic.objects.get_or_create(name="orders", defaults={"queues": 1})[0]


@pytest.mark.django_db
def test_an_operator_creates_a_fifo_group_and_its_page_shows_the_held_groups() -> None:
    otto = login("txhub-operators", "otto")
    form = {"name": "ledger", "max_delivery_attempts": "5", "consume_from": "first", "fifo": "on"}
    assert otto.post("/console/consumer-groups/new/", form).status_code == 302
    plain = {"name": "plain", "max_delivery_attempts": "5", "consume_from": "first"}
    assert otto.post("/console/consumer-groups/new/", plain).status_code == 302
    assert ConsumerGroup.objects.get(name="ledger").fifo is True
    assert ConsumerGroup.objects.get(name="plain").fifo is False
    listed = otto.get("/console/consumer-groups/").content.decode()
    assert re.search(r"ledger</a></td><td>FIFO</td>", listed), listed
    assert re.search(r"plain</a></td><td>any</td>", listed), listed

    registry.topic_create(name="orders", queues=1)
    send("order-9527", "first")
    send("order-9527", "second")
    send("order-9527", "third")
    send("order-1", "other")
    ledger = ConsumerGroup.objects.get(name="ledger")
    received = consuming.message_receive(
        group=ledger, topic=_orders(), max_messages=32, invisible_seconds=60
    )
    assert sorted(bytes(r.message.body) for r in received) == [b"first", b"other"]
    page = otto.get("/console/consumer-groups/ledger/").content.decode()
    held = page.split('id="held-groups"')[1].split("</table>")[0]
    head = next(r for r in received if r.message.message_group == "order-9527")
    assert "<code>order-9527</code></td><td>2</td>" in held, held
    assert head.message.msg_id in held, held
    assert "order-1" not in held, held  # nothing of it waits
    consuming.message_ack(group=ledger, receipt_handles=[head.receipt_handle])
    consuming.message_receive(group=ledger, topic=_orders(), max_messages=32, invisible_seconds=60)
    held = otto.get("/console/consumer-groups/ledger/").content.decode()
    assert "<code>order-9527</code></td><td>1</td>" in held
    plain_page = otto.get("/console/consumer-groups/plain/").content.decode()
    assert 'id="held-groups"' not in plain_page


@pytest.mark.django_db
def test_the_admin_shows_and_filters_fifo_groups() -> None:
    root = User.objects.create_superuser("root")
    admin = Client()
    admin.force_login(root)
    for name, fifo in (("ledger", True), ("plain", False)):
        registry.consumer_group_create(
            name=name, max_delivery_attempts=5, consume_from="first", fifo=fifo
        )
    fifo_only = admin.get("/admin/broker/consumergroup/?fifo__exact=1").content.decode()
    assert "ledger" in fifo_only
    assert "plain" not in fifo_only
    everything = admin.get("/admin/broker/consumergroup/").content.decode()
    assert "plain" in everything  # positive control
    assert "column-fifo" in everything
