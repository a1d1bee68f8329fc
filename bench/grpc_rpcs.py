"""Server CPU of one gRPC call, per RPC: what the gRPC processes and Postgres spend on each of the
hot RPCs (issue 28), read from /proc (bench/cpu.py) around N calls of one kind, made one after
another over one channel with raw stubs (the official client's requests, signed as it signs).

- Heartbeat: a producer's.
- SendMessage: one normal message per call (as the official client's `send`).
- ReceiveMessage: one message per call, no long poll (a receive that finds one at once).
- AckMessage: one receipt handle per call (as the official client's `ack`).
- EndTransaction: COMMIT of a half sent just before (the halves' sends are not counted).

A library of grpc_send.py, which prints its line.
"""

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import cpu
import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.util.signature import Signature

HOT = ("SendMessage", "ReceiveMessage", "AckMessage", "EndTransaction", "Heartbeat")


# A client id is its token's (docs/decisions/0034): each run its own.
CLIENT_ID = f"bench-grpc-rpcs-{uuid.uuid4().hex[:12]}"


def metadata(keys: dict[str, str]) -> list[tuple[str, str]]:
    """A call's metadata, signed now as the official Python client signs it."""
    date_time = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    signature = Signature.sign(keys["secret_key"], date_time)
    return [
        ("x-mq-date-time", date_time),
        ("x-mq-client-id", CLIENT_ID),
        ("x-mq-language", "PYTHON"),
        (
            "authorization",
            f"MQv2-HMAC-SHA1 Credential={keys['access_key']}, SignedHeaders=x-mq-date-time, "
            f"Signature={signature}",
        ),
    ]


def _checked(answer: Any, what: str) -> Any:
    if answer.status.code != pb.OK:
        raise RuntimeError(f"{what}: {answer.status.code} {answer.status.message}")
    return answer


class _Calls:
    def __init__(self, stub: Any, keys: dict[str, str], topic: str, group: str) -> None:
        self.stub, self.keys, self.topic, self.group = stub, keys, topic, group
        self.handles: list[tuple[str, str]] = []  # (message id, receipt handle)
        self.halves: list[tuple[str, str]] = []  # (message id, transaction id)

    def send(self, message_type: int = pb.NORMAL) -> Any:
        request = send_request(self.topic, message_type)
        answer = self.stub.SendMessage(request, metadata=metadata(self.keys))
        entry = _checked(answer, "SendMessage").entries[0]
        if message_type == pb.TRANSACTION:
            self.halves.append((entry.message_id, entry.transaction_id))
        return answer

    def send_half(self) -> Any:
        return self.send(pb.TRANSACTION)

    def receive(self) -> Any:
        request = receive_request(self.topic, self.group, 1)
        for answer in self.stub.ReceiveMessage(request, metadata=metadata(self.keys)):
            if answer.HasField("message"):
                system = answer.message.system_properties
                self.handles.append((system.message_id, system.receipt_handle))
            elif answer.HasField("status"):
                _checked(answer, "ReceiveMessage")

    def ack(self) -> Any:
        request = ack_request(self.topic, self.group, *self.handles.pop())
        return _checked(self.stub.AckMessage(request, metadata=metadata(self.keys)), "Ack")

    def end(self) -> Any:
        message_id, transaction_id = self.halves.pop()
        request = rpc.EndTransactionRequest(
            topic=pb.Resource(name=self.topic),
            message_id=message_id,
            transaction_id=transaction_id,
            resolution=pb.COMMIT,
            source=pb.SOURCE_CLIENT,
        )
        answer = self.stub.EndTransaction(request, metadata=metadata(self.keys))
        return _checked(answer, "EndTransaction")

    def heartbeat(self) -> Any:
        request = rpc.HeartbeatRequest(client_type=pb.PRODUCER, group=pb.Resource(name=self.group))
        return _checked(self.stub.Heartbeat(request, metadata=metadata(self.keys)), "Heartbeat")


def send_request(topic: str, message_type: int = pb.NORMAL) -> Any:
    """One message with the client's own fresh id, as the official client's `send`."""
    message = pb.Message(
        topic=pb.Resource(name=topic),
        body=b"bench message body",
        system_properties=pb.SystemProperties(
            message_id=uuid.uuid4().hex.upper(),
            message_type=message_type,
            body_encoding=pb.IDENTITY,
            born_timestamp=_now(),
            born_host="bench",
        ),
    )
    return rpc.SendMessageRequest(messages=[message])


def receive_request(topic: str, group: str, batch: int) -> Any:
    """Up to `batch` messages, no long poll."""
    return rpc.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
        batch_size=batch,
        invisible_duration=_seconds(30),
        auto_renew=False,
    )


def ack_request(topic: str, group: str, message_id: str, handle: str) -> Any:
    """One receipt handle, as the official client's `ack`."""
    return rpc.AckMessageRequest(
        group=pb.Resource(name=group),
        topic=pb.Resource(name=topic),
        entries=[rpc.AckMessageEntry(message_id=message_id, receipt_handle=handle)],
    )


def _now() -> Any:
    from google.protobuf.timestamp_pb2 import Timestamp

    stamp = Timestamp()
    stamp.GetCurrentTime()
    return stamp


def _seconds(value: int) -> Any:
    from google.protobuf.duration_pb2 import Duration

    return Duration(seconds=value)


def per_rpc(
    *, endpoint: str, keys: dict[str, str], topic: str, group: str, calls: int, data_dir: str
) -> dict[str, tuple[float, float]]:
    """RPC name -> (gRPC-process ms, Postgres ms) per call, over `calls` calls each."""
    root = Path(__file__).resolve().parent.parent
    found: dict[str, tuple[float, float]] = {}
    with grpc.insecure_channel(endpoint) as channel:
        it = _Calls(MessagingServiceStub(channel), keys, topic, group)
        # One of each first, as bench/rest_calls.py does: the channel is up, the group's
        # cursors on the topic exist and the caches are warm before anything is counted.
        it.heartbeat()
        it.send()
        it.receive()
        it.ack()

        def measured(name: str, call: Callable[[], Any]) -> None:
            found[name] = cpu.per_call(root, data_dir, calls=calls, call=call, server="grpc")

        measured("Heartbeat", it.heartbeat)
        measured("SendMessage", it.send)
        measured("ReceiveMessage", it.receive)
        measured("AckMessage", it.ack)
        for _ in range(calls):
            it.send_half()
        measured("EndTransaction", it.end)
    return found
