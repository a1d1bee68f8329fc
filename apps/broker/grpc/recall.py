"""RocketMQ 5.3's recall handle and its RecallMessage RPC (docs/decisions/0055).

The handle is RocketMQ's own (org.apache.rocketmq.common.producer.RecallMessageHandle, "v1"):
base64url of "v1 <topic> <broker name> <delivery time, epoch ms> <message id>", so a client
treats txhub's as it treats a RocketMQ broker's. The message id and the topic decide what is
recalled; the service (services/recall.py) decides whether it may be, as for the REST door."""

import base64
import binascii
from datetime import datetime
from typing import Any

from apps.broker import limits
from apps.broker.grpc.auth import Caller
from apps.broker.grpc.calls import unary
from apps.broker.grpc.protocol import Code, Refusal, rpc, status
from apps.broker.grpc.resources import BROKER_NAME, as_caller
from apps.broker.services import recall

VERSION = "v1"
INVALID = "The recall handle is not one txhub gave."


def handle_of(*, topic: str, deliver_at: datetime, msg_id: str) -> str:
    """The recall handle of a delayed message, answered with its send."""
    millis = str(int(deliver_at.timestamp() * 1000))
    raw = " ".join([VERSION, topic, BROKER_NAME, millis, msg_id])
    return base64.urlsafe_b64encode(raw.encode()).decode()


def decoded(handle: str) -> tuple[str, str]:
    """(topic, message id) of a handle; Refusal(BAD_REQUEST) unless it has the v1 shape."""
    try:
        padded = handle + "=" * (-len(handle) % 4)
        raw = base64.urlsafe_b64decode(padded.encode("ascii")).decode()
    except (UnicodeError, binascii.Error, ValueError):
        raise Refusal(Code.BAD_REQUEST, INVALID) from None
    items = raw.split(" ")
    if len(items) != 5 or items[0] != VERSION or not items[3].isdigit():
        raise Refusal(Code.BAD_REQUEST, INVALID)
    topic, msg_id = items[1], items[4]
    try:
        limits.check_name(topic, what="The topic")
        limits.check_msg_id(msg_id)
    except limits.LimitError:
        raise Refusal(Code.BAD_REQUEST, INVALID) from None
    return topic, msg_id


def _recall(caller: Caller, request: Any) -> Any:
    topic, msg_id = decoded(request.recall_handle)
    if request.topic.name != topic:
        raise Refusal(Code.BAD_REQUEST, "The recall handle is for another topic.")
    recalled = recall.message_recall(
        msg_id=msg_id, principal=caller.principal, door="grpc", topic=topic
    )
    return rpc.RecallMessageResponse(status=status(), message_id=recalled.msg_id)


class RecallRpcs:
    @unary(rpc.RecallMessageResponse)
    async def RecallMessage(self, request: Any, context: Any) -> Any:
        return await as_caller(context, _recall, request)
