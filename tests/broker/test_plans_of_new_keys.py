"""A new topic or consumer group is not in Postgres' statistics until autovacuum next analyzes
its table, and the planner then counts on it having one row. Its receives and acks must still
read only what they hand out or ack, never the group's or topic's whole history (decision 0030:
with single-column FK indexes the planner took them for this, and every receive read the topic's
whole commit log while the bench ran on a fresh database)."""

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from apps.broker.models import ConsumerGroup, Topic
from apps.broker.services import consuming, sending

HISTORY = 2000  # per topic: already received and acked by its group
NEW = 8
QUEUES = 4


def _history(topic: Topic, group: ConsumerGroup) -> None:
    """HISTORY messages in the topic, all of them received and acked by the group, with the
    queue counters and the group's cursors past them: what a group that has been working has."""
    per_queue = HISTORY // QUEUES
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO broker_commitlogentry (msg_id, queue_id, tags, keys, properties, body, "
            "body_is_binary, born_at, queue_offset, producer_group, transaction_id, stored_at, "
            "topic_id) "
            "SELECT %(prefix)s || n, n %% %(queues)s, '', '[]', '{}', 'x', false, now(), "
            "n / %(queues)s, 'history', NULL, now(), %(topic)s "
            "FROM generate_series(0, %(count)s - 1) AS n",
            {"prefix": f"h{topic.pk}-", "queues": QUEUES, "topic": topic.pk, "count": HISTORY},
        )
        cursor.execute(
            "INSERT INTO broker_delivery (group_id, topic_id, message_id, state, attempts, "
            "invisible_until, handle_token, first_received_at, last_received_at, acked_at) "
            "SELECT %s, %s, e.offset, 'INFLIGHT', 1, now(), 't', now(), now(), NULL "
            "FROM broker_commitlogentry e WHERE e.topic_id = %s",
            [group.pk, topic.pk, topic.pk],
        )
        # Acked as consumers ack: each row was in flight first, and the in-flight index keeps
        # its entries until vacuum.
        cursor.execute(
            "UPDATE broker_delivery SET state = 'ACKED', acked_at = now() WHERE group_id = %s",
            [group.pk],
        )
        cursor.execute(
            "UPDATE broker_messagequeue SET next_offset = %s WHERE topic_id = %s",
            [per_queue, topic.pk],
        )
        cursor.execute(
            "INSERT INTO broker_consumercursor (group_id, topic_id, queue_id, next_offset) "
            "SELECT %s, %s, q, %s FROM generate_series(0, %s - 1) AS q",
            [group.pk, topic.pk, per_queue, QUEUES],
        )


def _rows_read() -> int:
    """Rows of the commit log and of the deliveries this transaction has read so far."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)), 0) "
            "FROM pg_stat_xact_user_tables "
            "WHERE relname IN ('broker_commitlogentry', 'broker_delivery')"
        )
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.django_db
def test_a_new_group_on_a_new_topic_reads_only_what_it_takes(
    setup_topic: Callable[..., dict[str, Any]],
) -> None:
    setup_topic(topic="known", queues=QUEUES, consumer="known-group")
    _history(Topic.objects.get(name="known"), ConsumerGroup.objects.get(name="known-group"))
    with connection.cursor() as cursor:
        # What autovacuum would have done by now: the statistics know the first topic only.
        cursor.execute(
            "ANALYZE broker_commitlogentry, broker_delivery, broker_consumercursor, "
            "broker_messagequeue"
        )
    setup_topic(topic="fresh", queues=QUEUES, producer="fresh-service", consumer="fresh-group")
    topic = Topic.objects.get(name="fresh")
    group = ConsumerGroup.objects.get(name="fresh-group")
    _history(topic, group)
    sending.message_send_batch(
        topic=topic,
        messages=[
            (
                sending.OutgoingMessage(
                    producer_group="fresh-service", body=b"new", body_is_binary=False
                ),
                None,
            )
            for _ in range(NEW)
        ],
    )

    before = _rows_read()
    received = consuming.message_receive(
        group=group, topic=topic, max_messages=NEW, invisible_seconds=60
    )
    after_receive = _rows_read()
    acked, invalid = consuming.message_ack(
        group=group, receipt_handles=[r.receipt_handle for r in received]
    )
    after_ack = _rows_read()

    assert [bytes(r.message.body) for r in received] == [b"new"] * NEW
    assert len(acked) == NEW
    assert invalid == []
    # A plan that walks the topic's or the group's history reads HISTORY rows or more; the
    # statements that take NEW messages read a few rows per queue and per message.
    assert after_receive - before <= 10 * NEW, after_receive - before
    assert after_ack - after_receive <= 2 * NEW, after_ack - after_receive


@pytest.mark.django_db
def test_the_indexes_led_by_the_group_on_deliveries_hold_only_what_it_holds_now() -> None:
    """The planner may take any index led by the group for a group it does not know; each of
    them must hold the group's in-flight or dead-lettered rows only, never its acked history."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, i.indpred IS NOT NULL FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] "
            "WHERE i.indrelid = 'broker_delivery'::regclass AND a.attname = 'group_id'"
        )
        led_by_group = dict(cursor.fetchall())
    assert led_by_group == {
        "delivery_inflight_idx": True,
        "delivery_dlq_idx": True,
        "delivery_held_idx": True,
        "delivery_fifo_head_idx": True,
    }
