"""A shop's traffic and one of each anomaly the reconciliation job must find, written behind the
services' back; the job run as beat runs it, and what it found."""

import uuid
from datetime import date, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone
from pyspark.sql import SparkSession

from apps.broker.models import HalfMessage, ReconciliationRun, Resolver
from apps.broker.services import registry, sending, transactions
from apps.broker.services.reconciliation import database_url
from apps.broker.services.sending import OutgoingMessage, message_send
from apps.broker.services.transactions import Actor
from spark_jobs.reconcile import reconcile, run_start
from spark_jobs.session import Database

PRODUCER = Actor(Resolver.PRODUCER, "shop-service")
MAX_PENDING_AGE = 3600.0


class Shop:
    def __init__(self) -> None:
        self.topic = registry.topic_create(name="orders", queues=2)
        self.group = registry.producer_group_create(
            name="shop", check_url="http://127.0.0.1:9/check"
        )
        self.n = 0

    def prepare(self, **extra: Any) -> HalfMessage:
        self.n += 1
        message = OutgoingMessage(
            producer_group="shop", body=f"order {self.n}".encode(), body_is_binary=False
        )
        return transactions.transaction_prepare(
            producer_group=self.group, topic=self.topic, message=message, actor=PRODUCER, **extra
        )

    def committed(self, **extra: Any) -> HalfMessage:
        half = self.prepare(**extra)
        transactions.transaction_commit(transaction_id=half.transaction_id, actor=PRODUCER)
        return half

    def rolled_back(self) -> HalfMessage:
        half = self.prepare()
        transactions.transaction_rollback(transaction_id=half.transaction_id, actor=PRODUCER)
        return half

    def normal_traffic(self) -> None:
        for _ in range(8):
            self.committed()
        for _ in range(3):
            self.rolled_back()
        self.prepare()  # pending, young
        parked = self.prepare()
        system = Actor(Resolver.SYSTEM, "")
        transactions.transaction_park(
            transaction_id=parked.transaction_id, actor=system, reason="t"
        )
        resumed = self.prepare()
        transactions.transaction_park(
            transaction_id=resumed.transaction_id, actor=system, reason=""
        )
        transactions.transaction_resume(transaction_id=resumed.transaction_id, actor=system)
        self.committed(delay_level=5)  # committed, waiting as a delayed message: not lost
        operator = Actor(Resolver.OPERATOR, "otto")
        by_operator = self.prepare()
        transactions.transaction_commit(
            transaction_id=by_operator.transaction_id, actor=operator, reason="checked by hand"
        )
        plain = OutgoingMessage(producer_group="shop", body=b"plain", body_is_binary=False)
        message_send(topic=self.topic, message=plain)
        message_send(
            topic=self.topic, message=plain, deliver_at=timezone.now() + timedelta(hours=1)
        )


def sql(statement: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


COPY_LOG_ROW = """
INSERT INTO broker_commitlogentry (msg_id, queue_id, tags, keys, properties, body, body_is_binary,
    born_at, queue_offset, producer_group, transaction_id, stored_at, topic_id)
SELECT upper(md5(random()::text)), h.queue_id, '', '[]', '{}', h.body, false, h.born_at,
    100000 + (random() * 1000000)::int, 'shop', %s, now(), h.topic_id
FROM broker_halfmessage h WHERE h.id = %s
"""


def inject_one_of_each(shop: Shop) -> dict[str, str]:
    """Returns kind -> the transaction id (or delayed id) it concerns."""
    lost = shop.committed()
    sql("DELETE FROM broker_commitlogentry WHERE transaction_id = %s", [lost.transaction_id])

    leaked = shop.rolled_back()
    sql(COPY_LOG_ROW, [leaked.transaction_id, leaked.pk])

    conflicting = shop.committed()
    sql(
        "INSERT INTO broker_oprecord (half_id, op, source, actor, reason, detail, at) "
        "VALUES (%s, 'ROLLBACK', 'PRODUCER', '', '', '{}', now())",
        [conflicting.pk],
    )

    duplicated = shop.committed()
    sql(COPY_LOG_ROW, [duplicated.transaction_id, duplicated.pk])

    phantom = uuid.uuid4()
    sql(COPY_LOG_ROW, [phantom, duplicated.pk])

    drifted = shop.prepare()
    sql(
        "UPDATE broker_halfmessage SET state = 'COMMITTED', resolved_at = now(), "
        "resolved_by = 'PRODUCER' WHERE id = %s",
        [drifted.pk],
    )

    stuck = shop.prepare()
    sql(
        "UPDATE broker_halfmessage SET born_at = now() - make_interval(secs => %s) WHERE id = %s",
        [MAX_PENDING_AGE + 600, stuck.pk],
    )

    plain = OutgoingMessage(producer_group="shop", body=b"late", body_is_binary=False)
    late = sending.delayed_store(
        topic_id=shop.topic.pk,
        queue_id=0,
        msg_id="LATEDELAYED0001",
        message=plain,
        deliver_at=timezone.now() + timedelta(hours=1),
        born_at=timezone.now(),
    )
    sql(
        "UPDATE broker_delayedmessage SET deliver_at = now() - interval '5 minutes' WHERE id = %s",
        [late.pk],
    )
    return {
        "LOST_COMMIT": str(lost.transaction_id),
        "LEAKED_ROLLBACK": str(leaked.transaction_id),
        "CONFLICTING_OUTCOMES": str(conflicting.transaction_id),
        "DUPLICATE_LOG_ROW": str(duplicated.transaction_id),
        "PHANTOM_LOG_ROW": str(phantom),
        "STATE_DRIFT": str(drifted.transaction_id),
        "STUCK": str(stuck.transaction_id),
        "LATE_DELAY": str(late.pk),
    }


def run_job(
    spark: SparkSession, tmp_path: Any, day: date | None = None, **hooks: Any
) -> ReconciliationRun:
    db = Database.from_url(database_url())
    day = day or timezone.now().date()
    run_id = run_start(db, day=day, master="local[2]")
    reconcile(
        spark,
        db,
        day=day,
        run_id=run_id,
        max_pending_age=MAX_PENDING_AGE,
        partitions=3,
        output=tmp_path,
        **hooks,
    )
    return ReconciliationRun.objects.get(pk=run_id)


def found(run: ReconciliationRun) -> dict[str, str]:
    return {
        f.kind: str(f.delayed_id if f.kind == "LATE_DELAY" else f.transaction_id)
        for f in run.findings.all()
    }
