"""RocketMQ 5's SimpleConsumer: receive with an invisible time, ack, change the invisible time."""

import base64
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from txhub_client.http import Api

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceivedMessage:
    msg_id: str
    receipt_handle: str
    topic: str
    queue_id: int
    queue_offset: int
    tags: str | None
    keys: list[str]
    properties: dict[str, str]
    body: str | bytes
    born_at: str
    stored_at: str
    delivery_attempt: int
    transaction_id: str | None
    message_group: str | None = None  # in a FIFO group: one at a time, in order

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ReceivedMessage":
        body = data["body"] if "body" in data else base64.b64decode(data["body_base64"])
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k != "body" and k in data}
        return cls(body=body, **fields)


class SimpleConsumer:
    def __init__(
        self,
        url: str,
        token: str,
        group: str,
        *,
        topic: str,
        tag_expression: str = "*",
        invisible_seconds: int = 60,
    ) -> None:
        self.api = Api(url, token, timeout=60)
        self.group = group
        self.topic = topic
        self.tag_expression = tag_expression
        self.invisible_seconds = invisible_seconds

    def receive(self, max_messages: int = 16, wait_seconds: int = 0) -> list[ReceivedMessage]:
        answer = self.api.call(
            "POST",
            f"/consumer-groups/{self.group}/receive",
            {
                "topic": self.topic,
                "max_messages": max_messages,
                "wait_seconds": wait_seconds,
                "invisible_seconds": self.invisible_seconds,
                "tag_expression": self.tag_expression,
            },
        )
        return [ReceivedMessage.from_json(m) for m in answer["messages"]]

    def ack(self, messages: list[ReceivedMessage] | list[str]) -> tuple[list[str], list[str]]:
        """Returns (acked, invalid) receipt handles; an expired handle is invalid, not an error."""
        handles = [m if isinstance(m, str) else m.receipt_handle for m in messages]
        answer = self.api.call(
            "POST", f"/consumer-groups/{self.group}/ack", {"receipt_handles": handles}
        )
        return answer["acked"], answer["invalid"]

    def change_invisible_duration(self, message: ReceivedMessage, seconds: int) -> ReceivedMessage:
        answer = self.api.call(
            "POST",
            f"/consumer-groups/{self.group}/change-invisible",
            {"receipt_handle": message.receipt_handle, "invisible_seconds": seconds},
        )
        return ReceivedMessage.from_json(answer)

    def messages(
        self,
        handler: Callable[[ReceivedMessage], Any],
        *,
        wait_seconds: int = 20,
        max_messages: int = 16,
    ) -> Iterator[ReceivedMessage]:
        """Receives for ever; acks each message after `handler` returns. A handler that raises
        leaves the message unacked: it comes back after its invisible time."""
        while True:
            for message in self.receive(max_messages=max_messages, wait_seconds=wait_seconds):
                try:
                    handler(message)
                except Exception:  # noqa: BLE001 - redelivered later, by design
                    logger.exception("handler failed on %s; it will be redelivered", message.msg_id)
                    continue
                self.ack([message])
                yield message
