"""Reading and locking half message rows in plain SQL, with their topic and group loaded in the
same query (the commit's hot path: the ORM's compilation of these queries cost more CPU than the
rest of a commit together)."""

import uuid
from collections.abc import Collection
from typing import Any

from django.db import connection

from apps.broker import access, rows
from apps.broker.models import HalfMessage, ProducerGroup, Topic
from apps.broker.services.errors import NotFound

_LOCK_SQL = (
    f"SELECT {rows.columns(HalfMessage, 'h')}, {rows.columns(Topic, 't')}, "  # noqa: S608
    f"{rows.columns(ProducerGroup, 'g')} FROM broker_halfmessage h "
    "JOIN broker_topic t ON t.id = h.topic_id "
    "JOIN broker_producergroup g ON g.id = h.producer_group_id "
    "WHERE {where} FOR UPDATE OF h"
)


def lock(transaction_id: uuid.UUID, producer_groups: Collection[str] | None) -> HalfMessage:
    # Lock: commit, rollback, a check-back answer and an operator action on one transaction
    # queue up here, so exactly one of them moves it to a final state (CONTRACT invariant 2).
    # FOR UPDATE OF h: lock only the half row, not its (shared) topic and group rows. Plain SQL
    # (the commit's hot path): the ORM's compilation of this query cost more CPU than the rest
    # of the commit together.
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_SQL.format(where="h.transaction_id = %s"), [transaction_id])
        row = cursor.fetchone()
    return owned(None if row is None else half_of(row), transaction_id, producer_groups)


def lock_all(transaction_ids: list[uuid.UUID]) -> list[HalfMessage]:
    """`lock` for a batch: the rows locked in id order (the order every batch takes them in)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _LOCK_SQL.format(where="h.transaction_id = ANY(%s::uuid[]) ORDER BY h.id"),
            [transaction_ids],
        )
        found = cursor.fetchall()
    # A batch's halves mostly share one topic and group: each is loaded once, not once per row
    # (decision 0025: no per-row ORM work on the hot path).
    shared: dict[tuple[type, Any], Any] = {}
    return [half_of(row, shared) for row in found]


def half_of(row: Any, shared: dict[tuple[type, Any], Any] | None = None) -> HalfMessage:
    half = rows.load(HalfMessage, row)
    at = rows.width(HalfMessage)
    for model, field in ((Topic, "topic"), (ProducerGroup, "producer_group")):
        key = (model, row[at])  # the row's slice of `model` starts with its id
        related = None if shared is None else shared.get(key)
        if related is None:
            related = rows.load(model, row, at)
            if shared is not None:
                shared[key] = related
        setattr(half, field, related)
        at += rows.width(model)
    return half


def owned(
    half: HalfMessage | None, transaction_id: uuid.UUID, producer_groups: Collection[str] | None
) -> HalfMessage:
    if half is None or not access.producer_group_visible(
        name=half.producer_group.name, producer_groups=producer_groups
    ):
        # Another group's transaction answers as if it did not exist.
        raise NotFound(f"Transaction {transaction_id} does not exist.")
    return half
