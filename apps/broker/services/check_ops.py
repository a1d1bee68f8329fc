"""What check-back writes, whoever carried the check (HTTP or a producer's gRPC stream): its
actor and the CHECK op of one attempt."""

from typing import Any

from apps.broker.models import HalfMessage, OpKind, OpRecord, Resolver
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
