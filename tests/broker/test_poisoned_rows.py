"""Poisoned rows (issue 9): a row Postgres stores but psycopg cannot read back (a timestamp before
year 1, written here with raw SQL) does not stop any scan for the other rows; it is logged with
its id, counted in /metrics and not retried on every scan."""

import logging
from datetime import timedelta
from typing import Any

import pytest
from django.db import DataError, connection
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from apps.broker.metrics import EVENTS
from apps.broker.models import (
    CommitLogEntry,
    ConsumerGroup,
    DelayedMessage,
    Delivery,
    HalfMessage,
)
from apps.broker.services import (
    checkback,
    consuming,
    dead_letters,
    delivery,
    registry,
    retention,
    sending,
)
from apps.broker.services.sending import OutgoingMessage
from tests.support.metrics import METRICS_HEADERS
from tests.support.responses import expect
from tests.support.transactions import PRODUCER, make_group, prepare

POISON = "0001-01-01 00:00:00+01"  # stored by Postgres, unreadable by psycopg (year 0 in UTC)


def poison(table: str, column: str, pk: int, key: str = "id") -> None:
    where = f"FROM {table} WHERE {key} = %s"
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {column} = %s WHERE {key} = %s", [POISON, pk])  # noqa: S608
        cursor.execute(f"SELECT {column} {where}", [pk])  # noqa: S608
        with pytest.raises(DataError):  # the premise: reading it back really fails today
            cursor.fetchone()


def failed(scan: str) -> float:
    return EVENTS.get_sample_value("txhub_scan_rows_failed_total", {"scan": scan}) or 0.0


def logged(caplog: pytest.LogCaptureFixture, scan: str, pk: int) -> int:
    return sum(
        1
        for r in caplog.records
        if r.levelno == logging.ERROR and f"scan {scan}: row {pk} " in r.getMessage()
    )


def test_delayed_delivery_delivers_the_good_rows_beside_a_poisoned_one(
    api: APIClient, setup_topic: Any, caplog: pytest.LogCaptureFixture
) -> None:
    names = setup_topic(queues=1)
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    ids = [
        expect(
            api.post(
                f"/api/v1/topics/{names['topic']}/messages",
                {
                    "producer_group": names["producer"],
                    "body": body,
                    "deliver_at": later,
                },
                format="json",
            ),
            201,
        )["msg_id"]
        for body in ("good-1", "bad", "good-2")
    ]
    rows = {d.msg_id: d.pk for d in DelayedMessage.objects.all()}
    DelayedMessage.objects.update(deliver_at=timezone.now() - timedelta(seconds=1))
    bad = rows[ids[1]]
    poison("broker_delayedmessage", "deliver_at", bad)
    before = failed("delayed_delivery")

    assert delivery.delayed_deliver_due() == 2
    assert sorted(CommitLogEntry.objects.values_list("msg_id", flat=True)) == sorted(
        [ids[0], ids[2]]
    )
    assert list(DelayedMessage.objects.values_list("pk", flat=True)) == [bad]
    assert logged(caplog, "delayed_delivery", bad) == 1
    assert failed("delayed_delivery") == before + 1
    # Skipped from now on: the next scans neither fail on it nor report it again.
    assert delivery.delayed_deliver_for(seconds=0.2) == 0
    assert logged(caplog, "delayed_delivery", bad) == 1
    assert failed("delayed_delivery") == before + 1
    scrape = Client().get("/metrics", headers=METRICS_HEADERS).content.decode()
    assert 'txhub_scan_rows_failed_total{scan="delayed_delivery"}' in scrape


def test_checkback_scan_parks_and_claims_the_others_beside_a_poisoned_row(
    db: None, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP = 10
    topic = registry.topic_create(name="orders", queues=1)
    poisoned_group, other = make_group(name="poisoned"), make_group(name="other")
    bad, stale = prepare(poisoned_group, topic), prepare(poisoned_group, topic)
    due = prepare(other, topic)
    long_ago = timezone.now() - timedelta(hours=100)
    HalfMessage.objects.filter(pk=stale.pk).update(born_at=long_ago)
    HalfMessage.objects.filter(pk=due.pk).update(next_check_at=timezone.now())
    poison("broker_halfmessage", "born_at", bad.pk)
    before = failed("checkback_park_stale")

    # The scan's two steps, as tasks.checkback_scan runs them.
    assert checkback.checkback_park_stale() == 1
    claimed = checkback.checkback_claim_due()
    assert HalfMessage.objects.get(pk=stale.pk).state == "PARKED"
    assert due.pk in claimed  # the other group is still checked
    assert logged(caplog, "checkback_park_stale", bad.pk) == 1
    assert failed("checkback_park_stale") == before + 1
    assert checkback.checkback_park_stale() == 0  # not retried on every scan
    assert logged(caplog, "checkback_park_stale", bad.pk) == 1

    # A claimed poisoned row: the check task reports it and puts it away for a day.
    before_run = failed("checkback_run")
    assert checkback.checkback_run(half_id=bad.pk) == "unreadable"
    assert failed("checkback_run") == before_run + 1
    assert logged(caplog, "checkback_run", bad.pk) == 1
    [(checking_until, next_check_at)] = HalfMessage.objects.filter(pk=bad.pk).values_list(
        "checking_until", "next_check_at"
    )
    assert checking_until is None
    assert next_check_at is not None
    assert next_check_at > timezone.now() + timedelta(hours=23)


def test_deliveries_expire_dead_letters_other_groups_beside_a_poisoned_group(
    db: None, caplog: pytest.LogCaptureFixture
) -> None:
    topic = registry.topic_create(name="orders", queues=1)
    group = make_group(name="shop")
    registry.consumer_group_create(name="broken", max_delivery_attempts=1, consume_from="first")
    billing = registry.consumer_group_create(
        name="billing", max_delivery_attempts=1, consume_from="first"
    )
    from apps.broker.services import transactions

    half = prepare(group, topic)
    transactions.transaction_commit(transaction_id=half.transaction_id, actor=PRODUCER)
    consuming.message_receive(group=billing, topic=topic, max_messages=10, invisible_seconds=60)
    Delivery.objects.update(invisible_until=timezone.now() - timedelta(seconds=1))
    broken = ConsumerGroup.objects.get(name="broken")
    poison("broker_consumergroup", "created_at", broken.pk)
    before = failed("deliveries_expire")

    assert dead_letters.deliveries_expire() == 1
    assert Delivery.objects.get().state == "DLQ"
    assert logged(caplog, "deliveries_expire", broken.pk) == 1
    assert failed("deliveries_expire") == before + 1


def test_retention_deletes_a_poisoned_row_like_any_other(db: None) -> None:
    from apps.broker.services import transactions

    topic = registry.topic_create(name="orders", queues=1)
    group = make_group()
    bad, good = prepare(group, topic), prepare(group, topic)
    for half in (bad, good):
        transactions.transaction_commit(transaction_id=half.transaction_id, actor=PRODUCER)
    long_ago = timezone.now() - timedelta(hours=100)
    HalfMessage.objects.update(resolved_at=long_ago)
    CommitLogEntry.objects.update(stored_at=long_ago)
    poison("broker_halfmessage", "born_at", bad.pk)
    entry = CommitLogEntry.objects.get(transaction_id=bad.transaction_id)
    poison("broker_commitlogentry", "born_at", entry.pk, key='"offset"')

    swept = retention.retention_sweep()
    assert (swept["half_messages"], swept["commit_log"]) == (2, 2)
    assert not HalfMessage.objects.exists()
    assert not CommitLogEntry.objects.exists()


def test_delayed_delivery_delivers_the_others_beside_a_row_whose_id_is_taken(
    db: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A due delayed row whose id another message already holds in the commit log (what the
    race of two sends of one client id left behind before the claim, decision 0040) cannot be
    appended (unique msg_id): it is logged, counted and skipped, and the other group's message
    due after it, in the same queue and so the same append, is delivered at the next offset."""
    topic = registry.topic_create(name="orders", queues=1)
    squatter, other = make_group(name="squatter"), make_group(name="other")
    later = timezone.now() + timedelta(hours=1)

    def outgoing(group: Any, body: str) -> OutgoingMessage:
        return OutgoingMessage(producer_group=group.name, body=body.encode(), body_is_binary=False)

    sending.message_send(
        topic=topic, message=outgoing(squatter, "taken"), deliver_at=later, msg_id="01TAKEN"
    )
    fine = sending.message_send(topic=topic, message=outgoing(other, "fine"), deliver_at=later)
    visible = sending.message_send(topic=topic, message=outgoing(other, "visible"))
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE broker_commitlogentry SET msg_id = %s WHERE msg_id = %s",
            ["01TAKEN", visible.msg_id],
        )
    now = timezone.now()
    DelayedMessage.objects.filter(msg_id="01TAKEN").update(deliver_at=now - timedelta(seconds=2))
    DelayedMessage.objects.filter(msg_id=fine.msg_id).update(deliver_at=now - timedelta(seconds=1))
    bad = DelayedMessage.objects.get(msg_id="01TAKEN").pk
    before = failed("delayed_delivery")

    assert delivery.delayed_deliver_due() == 1
    assert list(CommitLogEntry.objects.order_by("queue_offset").values_list("msg_id")) == [
        ("01TAKEN",),
        (fine.msg_id,),
    ]
    assert list(CommitLogEntry.objects.values_list("queue_offset", flat=True).order_by("pk")) == [
        0,
        1,
    ]  # dense: the failed append took no offset
    assert list(DelayedMessage.objects.values_list("pk", flat=True)) == [bad]
    assert logged(caplog, "delayed_delivery", bad) == 1
    assert failed("delayed_delivery") == before + 1
    # Skipped from now on: the next scans neither fail on it nor report it again.
    assert delivery.delayed_deliver_for(seconds=0.2) == 0
    assert logged(caplog, "delayed_delivery", bad) == 1
    assert failed("delayed_delivery") == before + 1
