"""Reads shared by the API and the console."""

import contextlib
import copy
import uuid
from collections.abc import Collection
from datetime import timedelta
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from apps.broker import access, config_cache, rows
from apps.broker.models import (
    AuditRecord,
    CommitLogEntry,
    ConsumerCursor,
    ConsumerGroup,
    DelayedMessage,
    Delivery,
    DeliveryState,
    HalfMessage,
    MessageQueue,
    OpKind,
    OpRecord,
    ProducerGroup,
    RecalledMessage,
    ReconciliationRun,
    Topic,
)
from apps.broker.services import half_rows
from apps.broker.services.errors import NotFound

# The lookups every send, prepare and receive makes take `epoch`: the API request's
# configuration epoch (api/auth.py). With one, what they found is kept per process under it
# (config_cache.py) and each caller gets its own copy; without one (console, workers, gRPC), a
# plain query as before.


def _kept(epoch: str | None, key: tuple[str, ...], load: Any) -> Any:
    found = config_cache.read(epoch, key, load)
    return copy.copy(found) if epoch is not None and found is not None else found


def topic_get(*, name: str, epoch: str | None = None) -> Topic:
    topic: Topic | None = _kept(epoch, ("topic", name), lambda: rows.one_by(Topic, "name", name))
    if topic is None:
        raise NotFound(f"Topic {name!r} does not exist.", topic=name)
    return topic


def topic_queue_offsets(*, topic: Topic) -> list[dict[str, int]]:
    return topics_queue_offsets(topics=[topic])[topic.pk]


def topics_queue_offsets(*, topics: Collection[Topic]) -> dict[int, list[dict[str, int]]]:
    """Per topic id, its queues' offsets; one query however many topics."""
    offsets: dict[int, list[dict[str, int]]] = {topic.pk: [] for topic in topics}
    for q in MessageQueue.objects.filter(topic__in=topics).order_by("topic_id", "queue_id"):
        offsets[q.topic_id].append(
            {"queue_id": q.queue_id, "min_offset": 0, "max_offset": q.next_offset}
        )
    return offsets


def producer_group_get(*, name: str, epoch: str | None = None) -> ProducerGroup:
    return _group_get(ProducerGroup, "producer_group", name, epoch)


def consumer_group_get(*, name: str, epoch: str | None = None) -> ConsumerGroup:
    return _group_get(ConsumerGroup, "consumer_group", name, epoch)


G = TypeVar("G", ProducerGroup, ConsumerGroup)


def _group_get(model: type[G], kind: str, name: str, epoch: str | None) -> G:
    group: G | None = _kept(epoch, (kind, name), lambda: rows.one_by(model, "name", name))
    if group is None:
        what = kind.replace("_", " ").capitalize()
        raise NotFound(f"{what} {name!r} does not exist.", **{kind: name})
    return group


def transaction_get(
    *, transaction_id: uuid.UUID, producer_groups: Collection[str] | None = None
) -> HalfMessage:
    query = HalfMessage.objects.select_related("topic", "producer_group").prefetch_related("ops")
    return half_rows.owned(
        query.filter(transaction_id=transaction_id).first(), transaction_id, producer_groups
    )


def transaction_list(
    *,
    producer_groups: Collection[str] | None,
    state: str | None = None,
    older_than_seconds: int | None = None,
) -> QuerySet[HalfMessage]:
    query = HalfMessage.objects.select_related("topic", "producer_group").prefetch_related("ops")
    if producer_groups is not None:
        query = query.filter(producer_group__name__in=producer_groups)
    if state:
        query = query.filter(state=state)
    if older_than_seconds is not None:
        query = query.filter(born_at__lte=timezone.now() - timedelta(seconds=older_than_seconds))
    return query.order_by("born_at", "id")


def commit_log_entry_of(*, half: HalfMessage) -> CommitLogEntry | None:
    return CommitLogEntry.objects.filter(transaction_id=half.transaction_id).first()


def message_trace(
    *,
    msg_id: str,
    producer_groups: Collection[str] | None,
    consumer_groups: Collection[str] | None,
    half: HalfMessage | None = None,
) -> dict[str, Any]:
    """A message wherever it is: half message and its ops, commit-log position, deliveries,
    or its recall.
    A caller that has already loaded the half message passes it, so it is not read again.

    What the caller sees is what its groups cover (None: every group, the admin's view). A
    producer of the message sees it whole, with the deliveries of its own consumer groups only.
    A consumer sees a committed message on a topic one of its groups may receive from, with its
    own groups' deliveries and without the transaction (the producer's history, not its own):
    `producer_view` says which. Anything else answers 404, as if the message did not exist.
    """
    if half is None:
        half = (
            HalfMessage.objects.select_related("topic", "producer_group")
            .prefetch_related("ops")
            .filter(msg_id=msg_id)
            .first()
        )
    entry = CommitLogEntry.objects.select_related("topic").filter(msg_id=msg_id).first()
    delayed = DelayedMessage.objects.filter(msg_id=msg_id).first()
    # Recalled instead of delivered (docs/decisions/0055): when, by whom, through which door.
    recalled = None if entry or delayed else RecalledMessage.objects.filter(msg_id=msg_id).first()
    row = entry or delayed or recalled
    group = half.producer_group.name if half else row.producer_group if row else None
    producer_view = group is not None and access.producer_group_visible(
        name=group, producer_groups=producer_groups
    )
    consumer_view = (
        entry is not None
        and bool(consumer_groups)
        and access.topic_readable(consumer_groups=consumer_groups or (), topic=entry.topic)
    )
    if not (producer_view or consumer_view):
        raise NotFound(f"Message {msg_id} does not exist.")
    deliveries = Delivery.objects.none()
    if entry is not None and (consumer_groups is None or consumer_groups):
        deliveries = Delivery.objects.filter(message=entry)
        if consumer_groups is not None:
            deliveries = deliveries.filter(group__name__in=consumer_groups)
    return {
        "half": half if producer_view else None,
        "entry": entry,
        "delayed": delayed if producer_view else None,
        "recalled": recalled if producer_view else None,
        "deliveries": list(deliveries.select_related("group").order_by("group__name")),
        "producer_view": producer_view,
    }


def consumer_group_status(*, group: ConsumerGroup) -> list[dict[str, Any]]:
    """Per topic and queue: the group's offset, what is ready, in flight and dead-lettered. A FIFO
    group's held messages (read, waiting behind their group's head) count as ready."""
    cursors = ConsumerCursor.objects.filter(group=group).select_related("topic")
    counters = {
        (q.topic_id, q.queue_id): q.next_offset
        for q in MessageQueue.objects.filter(topic__in={c.topic_id for c in cursors})
    }
    counts: dict[tuple[int, int], Any] = {
        (row["topic_id"], row["message__queue_id"]): row
        # In flight, held or dead-lettered only: those rows are in the group's partial indexes,
        # and the acked history (most of the table) is read by none (decision 0030).
        for row in Delivery.objects.filter(
            group=group,
            state__in=[DeliveryState.INFLIGHT, DeliveryState.DLQ, DeliveryState.HELD],
        )
        .values("topic_id", "message__queue_id")
        .annotate(
            in_flight=Count("id", filter=Q(state=DeliveryState.INFLIGHT)),
            dlq=Count("id", filter=Q(state=DeliveryState.DLQ)),
            held=Count("id", filter=Q(state=DeliveryState.HELD)),
        )
    }
    rows = []
    for cursor in sorted(cursors, key=lambda c: (c.topic.name, c.queue_id)):
        key = (cursor.topic_id, cursor.queue_id)
        max_offset = counters.get(key, 0)
        ready = max(max_offset - cursor.next_offset, 0) + counts.get(key, {}).get("held", 0)
        in_flight = counts.get(key, {}).get("in_flight", 0)
        rows.append(
            {
                "topic": cursor.topic.name,
                "queue_id": cursor.queue_id,
                "max_offset": max_offset,
                "consumer_offset": cursor.next_offset,
                "ready": ready,
                "in_flight": in_flight,
                "lag": ready + in_flight,
                "dlq": counts.get(key, {}).get("dlq", 0),
            }
        )
    return rows


# A FIFO group's message groups that have messages held, each with its head: the delivery in
# flight that holds the others (none: the next receive hands the first held one out).
HELD_GROUPS_SQL = """
WITH held AS (
    SELECT topic_id, message_group, count(*) AS held FROM broker_delivery
    WHERE group_id = %(group)s AND state = 'HELD' GROUP BY topic_id, message_group
)
SELECT t.name, held.message_group, held.held, head.msg_id, head.attempts, head.since
FROM held JOIN broker_topic t ON t.id = held.topic_id
LEFT JOIN LATERAL (
    SELECT e.msg_id, d.attempts, d.first_received_at AS since
    FROM broker_delivery d JOIN broker_commitlogentry e ON e."offset" = d.message_id
    WHERE d.group_id = %(group)s AND d.topic_id = held.topic_id
        AND d.message_group = held.message_group AND d.state = 'INFLIGHT'
    LIMIT 1
) head ON true
ORDER BY head.since NULLS LAST, t.name, held.message_group
LIMIT %(limit)s
"""


def held_message_groups(*, group: ConsumerGroup, limit: int = 200) -> list[dict[str, Any]]:
    """Oldest first: the topic, the message group, how many messages wait, and the head's
    message id, attempts and since when it is in flight (docs/decisions/0054)."""
    with connection.cursor() as cursor:
        cursor.execute(HELD_GROUPS_SQL, {"group": group.pk, "limit": limit})
        names = ("topic", "message_group", "held", "head_msg_id", "head_attempts", "since")
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def dlq_list(*, group: ConsumerGroup) -> QuerySet[Delivery]:
    return (
        Delivery.objects.filter(group=group, state=DeliveryState.DLQ)
        .select_related("message", "topic")
        .order_by("dlq_at", "id")
    )


def transaction_search(
    *,
    state: str = "",
    producer_group: str = "",
    topic: str = "",
    older_than_seconds: int | None = None,
    min_check_times: int | None = None,
    query: str = "",
    order: str = "born_at",
) -> QuerySet[HalfMessage]:
    """The console's list: filters, a search over transaction id, message id or key, and a sort."""
    found = HalfMessage.objects.select_related("topic", "producer_group").defer("body")
    if state:
        found = found.filter(state=state)
    if producer_group:
        found = found.filter(producer_group__name=producer_group)
    if topic:
        found = found.filter(topic__name=topic)
    if older_than_seconds is not None:
        found = found.filter(born_at__lte=timezone.now() - timedelta(seconds=older_than_seconds))
    if min_check_times is not None:
        found = found.filter(check_times__gte=min_check_times)
    if query:
        # An id as given (a client's own, decision 0040) or upper-cased (txhub's, typed lower).
        match = Q(msg_id__in={query, query.upper()}) | Q(keys__contains=[query])
        with contextlib.suppress(ValueError):  # not every query is a transaction id
            match |= Q(transaction_id=uuid.UUID(query))
        found = found.filter(match)
    # The tie-break follows the sort's direction so that one index serves both directions.
    return found.order_by(order, "-id" if order.startswith("-") else "id")


def console_overview() -> dict[str, Any]:
    """The numbers on the console's first page."""
    from apps.broker.models import DelayedMessage, TransactionState

    hour_ago = timezone.now() - timedelta(hours=1)
    by_state = dict(
        HalfMessage.objects.filter(state__in=["PREPARED", "PARKED"])
        .values_list("state")
        .annotate(n=Count("id"))
    )
    resolved = dict(
        HalfMessage.objects.filter(resolved_at__gte=hour_ago)
        .values_list("state")
        .annotate(n=Count("id"))
    )
    oldest = HalfMessage.objects.filter(state=TransactionState.PREPARED).order_by("born_at").first()
    return {
        "pending": by_state.get("PREPARED", 0),
        "parked": by_state.get("PARKED", 0),
        "committed_last_hour": resolved.get("COMMITTED", 0),
        "rolled_back_last_hour": resolved.get("ROLLED_BACK", 0),
        "oldest_pending_seconds": (
            int((timezone.now() - oldest.born_at).total_seconds()) if oldest else None
        ),
        "delayed": DelayedMessage.objects.count(),
        "dlq": Delivery.objects.filter(state=DeliveryState.DLQ).count(),
        "checkback_success": _checkback_success_since(hour_ago),
        "reconciliation": reconciliation_latest(),
        "consumer_lag": sum(row["lag"] for row in consumer_lag()),
    }


def _checkback_success_since(since: Any) -> dict[str, Any]:
    """Check-back calls since `since` and the share that got a decision (COMMIT or ROLLBACK)."""
    checks = OpRecord.objects.filter(op=OpKind.CHECK, at__gte=since).aggregate(
        total=Count("id"),
        decided=Count("id", filter=Q(detail__answer__in=["COMMIT", "ROLLBACK"])),
    )
    total, decided = checks["total"], checks["decided"]
    return {"total": total, "decided": decided, "rate": decided / total if total else None}


CONSUMER_LAG_SQL = """
SELECT g.name, t.name, COALESCE(r.ready, 0) + COALESCE(d.held, 0), COALESCE(d.in_flight, 0),
    COALESCE(d.dlq, 0)
FROM (
    SELECT c.group_id, c.topic_id, sum(GREATEST(q.next_offset - c.next_offset, 0)) AS ready
    FROM broker_consumercursor c
    JOIN broker_messagequeue q ON q.topic_id = c.topic_id AND q.queue_id = c.queue_id
    GROUP BY c.group_id, c.topic_id
) r
FULL JOIN (
    SELECT group_id, topic_id, count(*) FILTER (WHERE state = 'INFLIGHT') AS in_flight,
        count(*) FILTER (WHERE state = 'DLQ') AS dlq, count(*) FILTER (WHERE state = 'HELD') AS held
    FROM broker_delivery WHERE state IN ('INFLIGHT', 'DLQ', 'HELD') GROUP BY group_id, topic_id
) d USING (group_id, topic_id)
JOIN broker_consumergroup g ON g.id = group_id
JOIN broker_topic t ON t.id = topic_id
ORDER BY g.name, t.name
"""


def consumer_lag() -> list[dict[str, Any]]:
    """Per consumer group and topic: ready (committed, not yet received), in flight (received,
    not acked), lag = ready + in flight, and DLQ size. One query for every group: the console's
    overview and group list and the /metrics gauges all read this."""
    with connection.cursor() as cursor:
        cursor.execute(CONSUMER_LAG_SQL)
        return [
            {
                "group": group,
                "topic": topic,
                "ready": int(ready),
                "in_flight": in_flight,
                "lag": int(ready) + in_flight,
                "dlq": dlq,
            }
            for group, topic, ready, in_flight, dlq in cursor.fetchall()
        ]


RESOLUTIONS_PER_MINUTE_SQL = """
SELECT date_trunc('minute', resolved_at) AS minute, state, resolved_by = 'CHECK_BACK', count(*)
FROM broker_halfmessage
WHERE resolved_at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s)
GROUP BY 1, 2, 3
"""


def resolutions_per_minute(*, minutes: int = 180) -> dict[str, Any]:
    """Commits, rollbacks and check-back resolutions per minute over the last `minutes`."""
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=minutes - 1)
    slots = [start + timedelta(minutes=i) for i in range(minutes)]
    series = {name: [0] * minutes for name in ("commits", "rollbacks", "checkback")}
    with connection.cursor() as cursor:
        cursor.execute(RESOLUTIONS_PER_MINUTE_SQL, {"minutes": minutes - 1})
        for minute, state, by_checkback, count in cursor.fetchall():
            index = int((minute - start).total_seconds() // 60)
            if not 0 <= index < minutes:
                continue
            series["commits" if state == "COMMITTED" else "rollbacks"][index] += count
            if by_checkback:
                series["checkback"][index] += count
    return {"slots": slots, **series}


PENDING_AGE_BUCKETS = [
    (10, "<10 s"),
    (60, "10 s–1 min"),
    (300, "1–5 min"),
    (1800, "5–30 min"),
    (3600, "30 min–1 h"),
    (21600, "1–6 h"),
    (86400, "6–24 h"),
]
PENDING_BY_AGE_SQL = """
SELECT width_bucket(EXTRACT(EPOCH FROM now() - born_at), %(limits)s::float8[]), count(*)
FROM broker_halfmessage WHERE state = 'PREPARED' GROUP BY 1
"""


def pending_by_age() -> list[tuple[str, int]]:
    """Unresolved (PREPARED) transactions in age buckets, youngest first."""
    labels = [label for _, label in PENDING_AGE_BUCKETS] + ["> 24 h"]
    counts = [0] * len(labels)
    with connection.cursor() as cursor:
        cursor.execute(PENDING_BY_AGE_SQL, {"limits": [float(s) for s, _ in PENDING_AGE_BUCKETS]})
        for bucket, count in cursor.fetchall():
            counts[bucket] += count
    return list(zip(labels, counts, strict=True))


def delayed_list() -> QuerySet[DelayedMessage]:
    """What waits for its delivery time, soonest first (the console's delayed page)."""
    return DelayedMessage.objects.select_related("topic").defer("body").order_by("deliver_at", "id")


def recalled_list() -> QuerySet[RecalledMessage]:
    """Delayed messages recalled before their delivery, latest first (the console's delayed
    page): when, by whom, through which door (docs/decisions/0055)."""
    return (
        RecalledMessage.objects.select_related("topic")
        .defer("body")
        .order_by("-recalled_at", "-id")
    )


def reconciliation_runs() -> QuerySet[ReconciliationRun]:
    return ReconciliationRun.objects.order_by("-started_at", "-id")


def reconciliation_get(*, run_id: int) -> ReconciliationRun:
    run = ReconciliationRun.objects.prefetch_related("findings").filter(pk=run_id).first()
    if run is None:
        raise NotFound(f"Reconciliation run {run_id} does not exist.")
    return run


def reconciliation_latest() -> ReconciliationRun | None:
    return reconciliation_runs().annotate(findings_count=Count("findings")).first()


def audit_records() -> QuerySet[AuditRecord]:
    """Newest first (audit_record_at_idx), for a paginator."""
    return AuditRecord.objects.order_by("-at", "-id")
