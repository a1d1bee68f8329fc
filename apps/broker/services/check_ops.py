"""What check-back writes, whoever carried the check (HTTP or a producer's gRPC stream): its
actor, the CHECK op of one attempt, and the one resolver of its answers (decision 0048)."""

from datetime import datetime
from typing import Any

from apps.broker.models import UNRESOLVED_STATES, HalfMessage, OpKind, OpRecord, Resolver
from apps.broker.models import TransactionState as State
from apps.broker.services import transactions
from apps.broker.services.transactions import Actor

CHECK_BACK = Actor(Resolver.CHECK_BACK, "check-back")


def record_check(half: HalfMessage, detail: dict[str, Any], now: Any) -> None:
    """The CHECK op of one check-back attempt, over HTTP or a producer's gRPC stream."""
    OpRecord.objects.create(
        half=half,
        op=OpKind.CHECK,
        source=Resolver.CHECK_BACK,
        actor="check-back",
        reason=detail["error"],
        detail=detail,
        at=now,
    )


RESOLVED_MEANWHILE = "resolved-meanwhile"
DECISIVE = frozenset({"COMMIT", "ROLLBACK"})


def checkback_resolve(
    half: HalfMessage, *, detail: dict[str, Any], now: datetime, carrier: str
) -> str | None:
    """Check-back's answer (`detail["answer"]`) to a check of `half`, which the caller holds
    locked, carried by HTTP or a producer's gRPC stream (`carrier`, named in the reason): the
    one place an answer is applied (decision 0048). Recorded as a CHECK op either way; applied
    only while the transaction is unresolved (CONTRACT invariant 7), through the same commit and
    rollback services as the producer's own calls. Returns RESOLVED_MEANWHILE (not applied),
    the answer (COMMIT, ROLLBACK: resolved), or None: the answer decides nothing (UNKNOWN, or
    no answer), the caller schedules the next check."""
    answer = detail["answer"]
    decisive = answer in DECISIVE
    # A decision applies while the transaction is unresolved, PARKED included: a stream check is
    # counted when sent, so the last one the budget allows parks the transaction before its
    # answer can arrive, and a PARKED transaction may still be committed or rolled back (CONTRACT
    # sections 1 and 4). An UNKNOWN for a transaction no longer PREPARED schedules nothing.
    if half.state not in (UNRESOLVED_STATES if decisive else (State.PREPARED,)):
        record_check(half, {**detail, "applied": False}, now)
        return RESOLVED_MEANWHILE
    record_check(half, {**detail, "applied": decisive}, now)
    if not decisive:
        return None
    resolve = (
        transactions.transaction_commit if answer == "COMMIT" else transactions.transaction_rollback
    )
    # `now`, the caller's instant, decides whether a delayed message is due yet: a worker's
    # own clock never does (CONTRACT invariant 8, docs/decisions/0020).
    resolve(
        transaction_id=half.transaction_id,
        actor=CHECK_BACK,
        reason=f"answered by {carrier}",
        now=now,
    )
    return str(answer)
