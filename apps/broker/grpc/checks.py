"""Check requests from check-back (a Celery worker) to the gRPC process that holds a producer's
Telemetry stream: Redis pub/sub, one channel per gRPC process. docs/decisions/0023.

A request lost on the way (the process died, Redis restarted) costs nothing but time: the
check was counted as sent, and the next one comes after TXHUB_CHECK_INTERVAL, as for a producer
that answered UNKNOWN."""

import asyncio
import json
import uuid
from typing import Any

from apps.broker.grpc import streams
from apps.broker.grpc.calls import db, log
from apps.broker.grpc.protocol import message_of, rpc
from apps.broker.models import HalfMessage
from apps.broker.models import TransactionState as State
from apps.broker.services import checkback_stream, clients
from txhub.redis_sentinel import broker_async_client

CHANNEL_PREFIX = checkback_stream.CHANNEL_PREFIX


def channel_of(process: str) -> str:
    return CHANNEL_PREFIX + process


async def listen(*, process: str) -> None:
    """Forwards every check request published for this process to the client's stream."""
    while True:
        client = broker_async_client()
        try:
            async with client.pubsub() as pubsub:
                await pubsub.subscribe(channel_of(process))
                async for item in pubsub.listen():
                    if item.get("type") == "message":
                        await _forward(json.loads(item["data"]))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # Redis away: checks wait for the next scan meanwhile
            log.warning("check-back listener: %s; subscribing again in 1 s", error)
            await asyncio.sleep(1)
        finally:
            await client.aclose()


async def _forward(request: dict[str, Any]) -> None:
    client_id = request["client_id"]
    # The client of this token: another token's client of the same id is another client
    # (decision 0100). A request without a token (sent before 0100) finds no stream.
    token_id = request.get("token_id")
    stream = None
    if isinstance(token_id, int):
        stream = streams.stream_of(token_id=token_id, client_id=client_id)
    if stream is None:
        log.info(
            "check for %s: client %s is not connected here", request["transaction_id"], client_id
        )
        return
    command = await db(_command_for, uuid.UUID(request["transaction_id"]), stream.token_id)
    if command is None:
        return  # resolved since the scan claimed it (invariant 7), or not this stream's to see
    stream.offer(command)


def _command_for(transaction_id: uuid.UUID, token_id: int) -> Any:
    half = (
        HalfMessage.objects.select_related("topic", "producer_group")
        .filter(transaction_id=transaction_id, state=State.PREPARED)
        .first()
    )
    if half is None:
        return None
    # Read now, not when the stream opened: a token revoked or narrowed since gets no check.
    if not clients.stream_may_check(token_id=token_id, producer_group=half.producer_group.name):
        log.warning("check for %s: the stream's token may not receive it", transaction_id)
        return None
    message = message_of(half, topic=half.topic.name)
    return rpc.TelemetryCommand(
        recover_orphaned_transaction_command=rpc.RecoverOrphanedTransactionCommand(
            message=message, transaction_id=str(transaction_id)
        )
    )
