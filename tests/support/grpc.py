"""The gRPC door from the client side: signed metadata, the official RocketMQ Python client's
configuration, messages and check-back listener, and a raw Telemetry stream."""

import queue
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import grpc
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.util.signature import Signature

from apps.broker.models import ApiToken, HalfMessage
from apps.broker.services import credentials
from tests.support.waiting import wait_until

if TYPE_CHECKING:
    from tests.grpc.conftest import GrpcServer, Setup

WAIT = 20  # seconds an expected command may take to arrive (a bound, not a measurement)


def signed(
    server: "GrpcServer", who: "Setup | ApiToken", client_id: str | None = None
) -> list[tuple[str, str]]:
    """gRPC metadata as a RocketMQ client signs it: with the credentials of `who` (a Setup's
    keys, or a token's), for the client id `client_id` (a fresh one when None)."""
    if isinstance(who, ApiToken):
        keys = credentials.of(who)
        access_key, secret_key = keys["access_key"], keys["secret_key"]
    else:
        access_key, secret_key = who.access_key, who.secret_key
    config = ClientConfiguration(server.endpoint, Credentials(access_key, secret_key))
    return list(Signature.metadata(config, client_id or f"client-{uuid.uuid4().hex[:8]}"))


def config(server: "GrpcServer", setup: "Setup", secret: str | None = None) -> Any:
    """The Python client's configuration for the setup's token (or another secret)."""
    return ClientConfiguration(
        server.endpoint, Credentials(setup.access_key, secret or setup.secret_key)
    )


def message(topic: str, body: bytes, tag: str = "", **extra: Any) -> Any:
    msg = Message()
    msg.topic = topic
    msg.body = body
    if tag:
        msg.tag = tag
    for key in extra.get("keys", []):
        msg.keys = key
    for name, value in extra.get("properties", {}).items():
        msg.add_property(name, value)
    if "delivery_timestamp" in extra:
        msg.delivery_timestamp = extra["delivery_timestamp"]
    if "message_group" in extra:
        msg.message_group = extra["message_group"]
    return msg


def start(clients: list[Any], client: Any) -> Any:
    """Starts a Python client, shut down by the `clients` fixture at the test's end."""
    client.startup()
    clients.append(client)
    return client


def consumer_of(
    clients: list[Any],
    server: "GrpcServer",
    setup: "Setup",
    listener: Any = None,
    **options: Any,
) -> Any:
    """A started consumer of the setup's group on every tag of its topic: a PushConsumer with
    `listener`, else a SimpleConsumer (`options`: the client's keyword arguments)."""
    subscription = {setup.topic: FilterExpression("*")}
    if listener is None:
        return start(
            clients, SimpleConsumer(config(server, setup), setup.consumer, subscription, **options)
        )
    consumer = PushConsumer(
        config(server, setup), setup.consumer, listener, subscription, **options
    )
    return start(clients, consumer)


class Checker(TransactionChecker):  # type: ignore[misc]
    """Answers check-back: COMMIT unless the body says rollback."""

    def __init__(self) -> None:
        self.checked: list[str] = []

    def check(self, message: Any) -> Any:
        self.checked.append(message.message_id)
        if b"rollback" in message.body:
            return TransactionResolution.ROLLBACK
        return TransactionResolution.COMMIT


def wait_for_state(msg_id: str, state: str) -> HalfMessage:
    def resolved() -> HalfMessage | None:
        half = HalfMessage.objects.get(msg_id=msg_id)
        return half if half.state == state else None

    half: HalfMessage | None = wait_until(resolved, timeout=60)
    assert half is not None, f"{msg_id} never became {state}"
    return half


class Telemetry:
    """An open Telemetry stream: commands are sent on demand, answers gathered by a thread."""

    def __init__(self, stub: MessagingServiceStub, meta: Any, *, read: bool = True) -> None:
        self.outgoing: queue.Queue[Any] = queue.Queue()
        self.incoming: queue.Queue[Any] = queue.Queue()
        self.call = stub.Telemetry(iter(self.outgoing.get, None), metadata=meta)
        self.errors: list[BaseException] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        if read:
            self.reader.start()

    @classmethod
    def unread(cls, stub: MessagingServiceStub, meta: Any) -> "Telemetry":
        """A client that sends and never reads what the server writes."""
        return cls(stub, meta, read=False)

    def _read(self) -> None:
        try:
            for command in self.call:
                self.incoming.put(command)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.CANCELLED:
                self.errors.append(error)
        except BaseException as error:  # noqa: BLE001 - reported by close()
            self.errors.append(error)
        self.incoming.put(None)  # the stream ended

    def send_settings(self, topics: list[str]) -> None:
        publishing = pb.Publishing(topics=[pb.Resource(name=topic) for topic in topics])
        self.outgoing.put(
            rpc.TelemetryCommand(
                settings=pb.Settings(client_type=pb.PRODUCER, publishing=publishing)
            )
        )

    def settings(self, topic: str) -> Any:
        self.send_settings([topic])
        return self.next()

    def next(self) -> Any:
        return self.incoming.get(timeout=WAIT)

    def close(self) -> None:
        self.outgoing.put(None)
        self.call.cancel()
        if self.reader.is_alive():
            self.reader.join(timeout=WAIT)
        assert not self.errors, self.errors


def receive_all(
    consumer: Any, count: int, *, invisible: int = 30, timeout: float = 30
) -> list[Any]:
    """What a RocketMQ SimpleConsumer receives until it has `count` messages or times out."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.receive(32, invisible) or []
    return got


def raw_message(default_topic: str, /, **change: Any) -> Any:
    """A normal message (the protocol's, for raw stubs) with a fresh client id; `change`
    overrides its topic, body, properties and system properties (`system={...}`)."""
    system = {"message_id": uuid.uuid4().hex.upper(), "message_type": pb.NORMAL}
    system.update(change.pop("system", {}))
    return pb.Message(
        topic=pb.Resource(name=change.pop("topic", default_topic)),
        body=change.pop("body", b"order 9527 created"),
        user_properties=change.pop("properties", {}),
        system_properties=pb.SystemProperties(**system),
    )


def prepare_raw(stub: MessagingServiceStub, meta: Any, setup: "Setup", body: bytes) -> HalfMessage:
    """A transaction prepared with a raw SendMessage under `meta`: its half message."""
    request = rpc.SendMessageRequest()
    item = request.messages.add()
    item.topic.name = setup.topic
    item.body = body
    item.system_properties.message_id = uuid.uuid4().hex.upper()
    item.system_properties.message_type = pb.TRANSACTION
    answer = stub.SendMessage(request, metadata=meta)
    assert answer.status.code == pb.Code.OK, answer.status
    return HalfMessage.objects.get(msg_id=answer.entries[0].message_id)
