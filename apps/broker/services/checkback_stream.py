"""Check-back over a RocketMQ producer's Telemetry stream: the answer.

The check goes out as a RecoverOrphanedTransactionCommand on a connected producer's stream; the
producer answers with EndTransaction(source=SOURCE_SERVER_CHECK), applied here as check-back's
answer: a CHECK op, then the same commit/rollback service, only while still PREPARED
(CONTRACT invariant 7). docs/decisions/0023."""

import uuid
from collections.abc import Collection
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.broker.models import HalfMessage, OpKind, OpRecord, Resolver
from apps.broker.models import TransactionState as State
from apps.broker.services import transactions
from apps.broker.services.errors import NotFound
from apps.broker.services.transactions import Actor

CHECK_BACK = Actor(Resolver.CHECK_BACK, "check-back")


def checkback_answer(
    *,
    transaction_id: uuid.UUID,
    answer: str,
    via: dict[str, Any],
    producer_groups: Collection[str] | None,
) -> str:
    """Applies a producer's answer to a check sent on its stream. Returns what happened."""
    with transaction.atomic():
        # Lock: the producer's own late commit/rollback, an operator or a second answer to the
        # same check queue up here; the answer applies only while the transaction is PREPARED.
        half = (
            HalfMessage.objects.select_for_update(of=("self",))
            .select_related("producer_group")
            .filter(transaction_id=transaction_id)
            .first()
        )
        if half is None or (
            producer_groups is not None and half.producer_group.name not in producer_groups
        ):
            raise NotFound(f"Transaction {transaction_id} does not exist.")
        detail = {"answer": answer, "reached": True, "status": None, "error": "", **via}
        if half.state != State.PREPARED:
            _record_check(half, {**detail, "applied": False})
            return "resolved-meanwhile"
        _record_check(half, {**detail, "applied": True})
        half.check_times += 1
        half.unreachable_checks = 0
        half.checking_until = None
        half.save(update_fields=["check_times", "unreachable_checks", "checking_until"])
        resolve = (
            transactions.transaction_commit
            if answer == "COMMIT"
            else transactions.transaction_rollback
        )
        resolve(
            transaction_id=transaction_id,
            actor=CHECK_BACK,
            reason="answered by the producer over its Telemetry stream",
        )
        return answer


def _record_check(half: HalfMessage, detail: dict[str, Any]) -> None:
    OpRecord.objects.create(
        half=half,
        op=OpKind.CHECK,
        source=Resolver.CHECK_BACK,
        actor="check-back",
        reason=detail["error"],
        detail=detail,
        at=timezone.now(),
    )
