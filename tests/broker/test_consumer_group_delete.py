"""Deleting a consumer group (docs/decisions/0088): the group goes with its cursors, deliveries
(in flight, held behind a FIFO head, dead-lettered, acked) and topic bindings, audited; the REST
door asks what creating a group asks (the admin scope); a receive afterwards answers as for a
group that never existed; and the retention sweep then frees the rows only that group held."""

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from apps.broker.fallback_reads import RECEIVABLE_SQL
from apps.broker.models import (
    AuditRecord,
    CommitLogEntry,
    ConsumerCursor,
    ConsumerGroup,
    Delivery,
    DeliveryState,
    Topic,
)
from apps.broker.services import consuming, registry, retention, sending
from apps.broker.services.errors import NotFound
from apps.broker.services.sending import OutgoingMessage
from apps.broker.wakeups import GROUP_DELETED, Hub
from tests.conftest import client_for
from tests.support.responses import assert_error


def topic_with(*groups: str, queues: int = 1, fifo: bool = False) -> tuple[Topic, list[Any]]:
    topic = registry.topic_create(name="orders", queues=queues)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    made = [
        registry.consumer_group_create(
            name=name, max_delivery_attempts=16, consume_from="first", fifo=fifo
        )
        for name in groups
    ]
    return topic, made


def send(topic: Topic, n: int, *, message_group: str = "") -> list[str]:
    sent = sending.message_send_batch(
        topic=topic,
        messages=[
            (
                OutgoingMessage(
                    "shop", f"m{i}".encode(), body_is_binary=False, message_group=message_group
                ),
                None,
            )
            for i in range(n)
        ],
    )
    return [s.msg_id for s in sent]


def receive(group: Any, topic: Topic, n: int) -> list[consuming.Received]:
    return consuming.message_receive(group=group, topic=topic, max_messages=n, invisible_seconds=60)


def rows_of(group_id: int) -> dict[str, int]:
    """Every row that names the group, table by table."""
    counts = {}
    with connection.cursor() as cursor:
        for table, column in (
            ("broker_consumergroup", "id"),
            ("broker_consumercursor", "group_id"),
            ("broker_delivery", "group_id"),
            ("broker_consumergroup_topics", "consumergroup_id"),
        ):
            cursor.execute(f"SELECT count(*) FROM {table} WHERE {column} = %s", [group_id])  # noqa: S608
            counts[table] = cursor.fetchone()[0]
    return counts


NOTHING = {
    "broker_consumergroup": 0,
    "broker_consumercursor": 0,
    "broker_delivery": 0,
    "broker_consumergroup_topics": 0,
}


def test_deleting_a_group_removes_every_row_it_had_and_only_its_own(db: None) -> None:
    topic, (billing, audit) = topic_with("billing", "audit-log", queues=2)
    registry.consumer_group_bind_topics(name="billing", topics=["orders"])
    send(topic, 6)
    got = receive(billing, topic, 6)
    acked, dead = got[:2], got[4:]  # the two between stay in flight
    consuming.message_ack(group=billing, receipt_handles=[r.receipt_handle for r in acked])
    Delivery.objects.filter(pk__in=[r.delivery.pk for r in dead]).update(
        state=DeliveryState.DLQ, dlq_at=timezone.now()
    )
    receive(audit, topic, 6)
    before = rows_of(billing.pk)
    assert before["broker_delivery"] == 6
    assert before["broker_consumercursor"] == 2
    kept = rows_of(audit.pk)

    gone = registry.consumer_group_delete(name="billing")

    assert gone == {"acked": 2, "inflight": 2, "dlq": 2}
    assert rows_of(billing.pk) == NOTHING
    assert rows_of(audit.pk) == kept  # positive control: the other group is untouched
    record = AuditRecord.objects.get(action="consumer_group_delete")
    assert (record.target, record.actor, record.door) == ("billing", "system", "system")
    # No token held its scope (tests/broker/test_deleted_group_leaves_no_access.py: those that do).
    assert record.detail == {
        "deliveries": gone,
        "topics_read": 1,
        "scope_removed_from_tokens": [],
    }


def test_a_fifo_groups_held_messages_go_with_it(db: None) -> None:
    topic, (fifo,) = topic_with("ordered", fifo=True)
    send(topic, 3, message_group="order-1")
    assert len(receive(fifo, topic, 3)) == 1  # the head; the two behind it are held
    assert Delivery.objects.filter(group=fifo, state=DeliveryState.HELD).count() == 2
    assert registry.consumer_group_delete(name="ordered") == {"inflight": 1, "held": 2}
    assert rows_of(fifo.pk) == NOTHING


def test_deleting_a_group_that_does_not_exist_is_not_found_and_records_nothing(
    db: None,
) -> None:
    with pytest.raises(NotFound):
        registry.consumer_group_delete(name="nobody")
    assert not AuditRecord.objects.exists()


def test_a_receive_of_a_deleted_group_it_had_read_before_is_refused_not_found(db: None) -> None:
    """The receive read its group before the deletion (a door's cache, or a wait that began
    before it): it is told the group is gone, and writes nothing."""
    topic, (billing,) = topic_with("billing")
    send(topic, 2)
    receive(billing, topic, 1)
    registry.consumer_group_delete(name="billing")
    with pytest.raises(NotFound) as refused:
        receive(billing, topic, 1)
    assert refused.value.details == {"consumer_group": "billing"}
    assert rows_of(billing.pk) == NOTHING


def test_rest_delete_asks_the_admin_scope_as_creating_a_group_does(db: None) -> None:
    topic_with("billing")
    consumer = client_for("consume:billing", name="consumer")
    refused = consumer.delete("/api/v1/consumer-groups/billing")
    assert_error(refused, 403, "forbidden")
    # The same token may not create one either: the one rule of both (admin scope).
    created = consumer.post("/api/v1/consumer-groups", {"name": "other"}, format="json")
    assert_error(created, 403, "forbidden")
    assert ConsumerGroup.objects.filter(name="billing").exists()
    anonymous = APIClient().delete("/api/v1/consumer-groups/billing")
    assert_error(anonymous, 401, "unauthenticated")
    assert ConsumerGroup.objects.filter(name="billing").exists()


def test_rest_delete_answers_204_then_receive_answers_as_for_a_group_never_made(
    api: APIClient, db: None
) -> None:
    topic, (billing,) = topic_with("billing")
    send(topic, 3)
    consumer = client_for("consume:billing", "consume:never-made", name="consumer")
    body = {"topic": "orders", "max_messages": 1}
    # A receive before: the group is read (and kept by this process under the epoch).
    assert consumer.post("/api/v1/consumer-groups/billing/receive", body, format="json").json()[
        "messages"
    ]

    deleted = api.delete("/api/v1/consumer-groups/billing", REMOTE_ADDR="203.0.113.7")

    assert deleted.status_code == 204, deleted.content
    assert deleted.content == b""
    assert rows_of(billing.pk) == NOTHING
    record = AuditRecord.objects.get(action="consumer_group_delete")
    assert (record.actor, record.door, record.address) == ("admin-test", "rest", "203.0.113.7")
    # The group's scope went with it (decision 0088): its consumer's token is refused 403; a
    # token that may name any group (admin) is told what a group never made is told.
    gone = consumer.post("/api/v1/consumer-groups/billing/receive", body, format="json")
    assert_error(gone, 403, "forbidden")
    after = api.post("/api/v1/consumer-groups/billing/receive", body, format="json")
    never = consumer.post("/api/v1/consumer-groups/never-made/receive", body, format="json")
    assert_error(after, 404, "not_found")
    assert_error(never, 404, "not_found")
    assert after.json()["error"]["message"] == "Consumer group 'billing' does not exist."
    assert_error(api.get("/api/v1/consumer-groups/billing"), 404, "not_found")
    assert_error(api.delete("/api/v1/consumer-groups/billing"), 404, "not_found")
    assert AuditRecord.objects.filter(action="consumer_group_delete").count() == 1
    # The name is free again: a new group of that name starts with nothing of the old one.
    assert (
        api.post("/api/v1/consumer-groups", {"name": "billing"}, format="json").status_code == 201
    )
    # Not to the old group's token: the operator gives the new group's scope to whom it chooses.
    again = consumer.post("/api/v1/consumer-groups/billing/receive", body, format="json")
    assert_error(again, 403, "forbidden")
    assert (
        api.post("/api/v1/consumer-groups/billing/receive", body, format="json").status_code == 200
    )


def test_after_deletion_the_sweep_frees_what_only_that_group_held(db: None) -> None:
    """Rows a lagging group holds survive retention; once it is deleted the next sweep takes
    them; rows another group has not had still survive (the positive control)."""
    topic, (lagging, done, slow) = topic_with("lagging", "done", "slow")
    other = registry.topic_create(name="payments", queues=1)
    held_by_lagging = send(topic, 3)
    held_by_slow = send(other, 2)
    receive(lagging, topic, 1)  # its cursors: from here on it holds the topic's log
    for r in receive(done, topic, 3):
        consuming.message_ack(group=done, receipt_handles=[r.receipt_handle])
    receive(slow, other, 1)  # holds the other topic's log, one row in flight
    CommitLogEntry.objects.update(stored_at=timezone.now() - timedelta(hours=73))

    assert retention.retention_sweep()["commit_log"] == 0
    assert set(CommitLogEntry.objects.values_list("msg_id", flat=True)) == {
        *held_by_lagging,
        *held_by_slow,
    }

    registry.consumer_group_delete(name="lagging")
    assert retention.retention_sweep()["commit_log"] == 3

    assert set(CommitLogEntry.objects.values_list("msg_id", flat=True)) == set(held_by_slow)
    assert ConsumerCursor.objects.filter(group=slow).exists()


def test_a_deletion_notice_wakes_each_waiter_of_the_group_on_every_topic_and_no_other() -> None:
    """What a process's hub does with the deletion's NOTIFY: every waiter of the group tries
    again (and is told), whatever it waits for; its notes of "nothing there" go."""

    async def scenario() -> tuple[list[bool], bool, bool]:
        hub = Hub()
        hub.listening = True
        mine = [hub.register(7, 3, wants=32) for _ in range(3)]
        mine.append(hub.register(8, 3, tags=frozenset({"TagA"})))
        others = [hub.register(7, 4), hub.register(8, 4)]
        hub.note_empty(7, 3, hub.mark(7))
        hub.note_empty(9, 4, hub.mark(9))
        hub._on_notify(f"{GROUP_DELETED} 3")
        return (
            [w.event.is_set() for w in mine + others],
            hub.known_empty(7, 3),
            hub.known_empty(9, 4),
        )

    woken, mine_noted, other_noted = asyncio.run(scenario())
    assert woken == [True] * 4 + [False, False]
    assert not mine_noted
    assert other_noted


def test_the_fallback_check_finds_the_waiters_of_a_deleted_group(db: None) -> None:
    """A deletion's NOTIFY missed (the hub was reconnecting): the next fallback check finds the
    group gone and wakes all its waiters; a group still there with nothing to receive, none."""
    topic, (doomed, idle) = topic_with("doomed", "idle")
    doomed_id = doomed.pk
    registry.consumer_group_delete(name="doomed")
    with connection.cursor() as cursor:
        cursor.execute(RECEIVABLE_SQL, ([topic.pk, topic.pk], [doomed_id, idle.pk], [False, True]))
        found = cursor.fetchall()
    assert found == [(topic.pk, doomed_id, None, 2**31 - 1)]
