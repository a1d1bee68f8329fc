"""Server CPU of one REST call through the lean door, for the calls bench/grpc_rpcs.py makes
through the gRPC door (issue 28: "each RPC no more than the lean REST door's answer to the same
call"). Read from /proc (bench/cpu.py) around N calls of one kind, made one after another over
one kept-alive connection with the bench's light HTTP client:

- send: one message per request (`POST /topics/{t}/messages`), as SendMessage with one message;
- receive: one message per request, no wait (`max_messages` 1, `wait_seconds` 0);
- ack: one receipt handle per request, as the official RocketMQ client's `ack`;
- commit: a transaction prepared just before (the prepares are not counted).

A library of grpc_send.py, which prints its line beside the gRPC door's.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import cpu
from http_client import Client

BODY = "bench message body"

# The same order as grpc_rpcs.HOT, without Heartbeat (REST has none).
PAIRS = (
    ("send", "SendMessage"),
    ("receive", "ReceiveMessage"),
    ("ack", "AckMessage"),
    ("commit", "EndTransaction"),
)


class _Calls:
    def __init__(self, client: Client, topic: str, group: str, producer_group: str) -> None:
        self.client, self.topic, self.group = client, topic, group
        self.producer_group = producer_group
        self.handles: list[str] = []
        self.prepared: list[str] = []

    def send(self) -> dict[str, Any]:
        payload = {"producer_group": self.producer_group, "body": BODY}
        return self.client.post(f"/topics/{self.topic}/messages", payload)

    def receive(self) -> dict[str, Any]:
        payload = {"topic": self.topic, "max_messages": 1, "wait_seconds": 0}
        answer = self.client.post(f"/consumer-groups/{self.group}/receive", payload)
        messages = answer["messages"]
        if len(messages) != 1:
            raise RuntimeError(f"receive: {len(messages)} messages, expected 1")
        self.handles.append(messages[0]["receipt_handle"])
        return answer

    def ack(self) -> dict[str, Any]:
        payload = {"receipt_handles": [self.handles.pop()]}
        answer = self.client.post(f"/consumer-groups/{self.group}/ack", payload)
        if answer.get("invalid"):
            raise RuntimeError(f"ack: {answer}")
        return answer

    def prepare(self) -> None:
        payload = {"producer_group": self.producer_group, "topic": self.topic, "body": BODY}
        self.prepared.append(self.client.post("/transactions", payload)["transaction_id"])

    def commit(self) -> dict[str, Any]:
        return self.client.post(f"/transactions/{self.prepared.pop()}/commit")


def per_call(
    *, base: str, token: str, topic: str, group: str, calls: int, data_dir: str
) -> dict[str, tuple[float, float]]:
    """Call name -> (web ms, Postgres ms) per call, over `calls` calls each. `group` is both the
    consumer group and the producer group (grpc_send.setup makes them with one name)."""
    root = Path(__file__).resolve().parent.parent
    found: dict[str, tuple[float, float]] = {}
    calls_of = _Calls(Client(base, token), topic, group, group)
    # One of each first, as bench/grpc_rpcs.py does: the connection is up, the group's cursors
    # on the topic exist and the caches are warm before anything is counted.
    calls_of.send()
    calls_of.receive()
    calls_of.ack()

    def measured(name: str, call: Callable[[], Any]) -> None:
        found[name] = cpu.per_call(root, data_dir, calls=calls, call=call, server="web")

    measured("send", calls_of.send)
    measured("receive", calls_of.receive)
    measured("ack", calls_of.ack)
    for _ in range(calls):
        calls_of.prepare()
    measured("commit", calls_of.commit)
    return found
