"""Check-back over a RocketMQ producer's Telemetry stream: the answer.

The check goes out as a RecoverOrphanedTransactionCommand on a connected producer's stream; the
producer answers with EndTransaction(source=SOURCE_SERVER_CHECK), applied here as check-back's
answer by the same resolver as an HTTP answer (check_ops.checkback_resolve, decision 0048).
docs/decisions/0023."""

import json
import uuid
from collections.abc import Collection
from typing import Any

import redis
from django.db import transaction
from django.utils import timezone

from apps.broker.models import HalfMessage, OpKind, OpRecord
from apps.broker.services import clients, half_rows, transactions
from apps.broker.services.check_ops import checkback_resolve
from apps.broker.services.transactions import Actor
from txhub.redis_sentinel import broker_client

# The gRPC processes' channels (apps/broker/grpc/checks.py subscribes to its own).
CHANNEL_PREFIX = "txhub:grpc:check:"


def checkback_send(*, half: HalfMessage) -> dict[str, Any] | None:
    """Asks a connected RocketMQ producer of the half's group to check it: publishes the request
    to the gRPC process holding the producer's stream (any process; a producer that publishes
    the topic first, and any instance of the group, so an orphan of a producer that exited is
    settled by another one). Returns what to record of it, or None: no producer connected (or
    none reachable), so the group's check URL is called as before."""
    producers = clients.producers_with_stream(group=half.producer_group.name, topic=half.topic.name)
    if not producers:
        return None
    request = json.dumps({"transaction_id": str(half.transaction_id)})
    # Both bounds: checkback_run holds the half row's lock across the connect and the PUBLISH,
    # and redis-py's connect timeout is 5 s unless given (not the socket timeout).
    connection = broker_client(socket_timeout=2, socket_connect_timeout=2)
    try:
        for producer in producers:
            # The client is its token's and its id's (decision 0100): both route the check.
            client = {"client_id": producer.client_id, "token_id": producer.token_id}
            payload = json.loads(request) | client
            try:
                # PUBLISH answers how many subscribers got it: 0 = that process is gone.
                delivered = connection.publish(
                    CHANNEL_PREFIX + producer.stream_process, json.dumps(payload)
                )
            except redis.RedisError:
                return None
            if delivered:
                return {"via": "telemetry", **client, "process": producer.stream_process}
    finally:
        connection.close()
    return None


def check_outstanding(half: HalfMessage, *, client_id: str, token_id: int) -> bool:
    """Whether the last check of `half` was sent on the stream of the token's client `client_id`
    and is not answered yet: the only case where that client's EndTransaction(SOURCE_SERVER_CHECK)
    is check-back's answer (docs/decisions/0034; the token too, decision 0100). Call with the
    half locked."""
    last = OpRecord.objects.filter(half=half, op=OpKind.CHECK).order_by("-id").first()
    return (
        last is not None
        and last.detail.get("via") == "telemetry"
        and "process" in last.detail  # the record of a check sent; an answer's has none
        and last.detail.get("client_id") == client_id
        and last.detail.get("token_id") == token_id
    )


def checkback_answer(
    *,
    transaction_id: uuid.UUID,
    answer: str,
    client_id: str,
    token_id: int,
    producer: Actor,
    producer_groups: Collection[str] | None,
) -> str:
    """Applies a producer's answer to a check sent on its stream. Returns what happened. With no
    check outstanding to this client, it is the producer's own resolution (`producer`)."""
    resolve = (
        transactions.transaction_commit if answer == "COMMIT" else transactions.transaction_rollback
    )
    with transaction.atomic():
        # Lock: the producer's own late commit/rollback, an operator or a second answer to the
        # same check queue up here; the answer applies only while the transaction is unresolved.
        # checkback_run holds it while it sends a check, so the check's record is seen here.
        half = (
            HalfMessage.objects.select_for_update(of=("self",))
            .select_related("producer_group")
            .filter(transaction_id=transaction_id)
            .first()
        )
        half = half_rows.owned(half, transaction_id, producer_groups)
        if not check_outstanding(half, client_id=client_id, token_id=token_id):
            resolve(transaction_id=transaction_id, actor=producer, producer_groups=producer_groups)
            return "producer"
        detail = {"answer": answer, "reached": True, "status": None, "error": ""}
        # The check was counted when it was sent (checkback_run): not counted again here.
        resolved = checkback_resolve(
            half,
            detail={**detail, "via": "telemetry", "client_id": client_id, "token_id": token_id},
            now=timezone.now(),
            carrier="the producer over its Telemetry stream",
        )
        return resolved or "unknown"
