"""RecallMessage over the gRPC door (docs/decisions/0055): the official Python client's
`recall_message` with the handle its SendReceipt carries, and the RPC's refusals, against the
real gRPC server on the test database. (The Node client: tests/grpc/test_node_client.py.)"""

import base64
import time
from typing import Any

import grpc
import pytest
from rocketmq import Producer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.exception import BadRequestException

from apps.broker.models import CommitLogEntry, DelayedMessage, RecalledMessage
from apps.broker.services import delivery, registry
from tests.grpc.conftest import GrpcServer
from tests.support.grpc import config, message, signed, start

pytestmark = pytest.mark.e2e


def handle_for(topic: str, msg_id: str) -> str:
    """A v1 handle as RocketMQ's broker builds it (RecallMessageHandle.HandleV1.buildHandle)."""
    raw = f"v1 {topic} txhub {int(time.time() * 1000)} {msg_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode()


def test_the_python_client_recalls_a_delayed_message_with_its_send_receipts_handle(
    grpc_server: GrpcServer, rocketmq_setup: Any, clients: list[Any]
) -> None:
    setup = rocketmq_setup("-recall")
    producer = start(clients, Producer(config(grpc_server, setup), (setup.topic,)))
    due = int(time.time()) + 60
    sent = producer.send(message(setup.topic, b"recalled", "TagA", delivery_timestamp=due))
    normal = producer.send(message(setup.topic, b"normal", "TagA"))
    assert not normal.recall_handle  # only a delayed message has one

    # RocketMQ's v1 handle: "v1 <topic> <broker> <delivery time, ms> <message id>", base64url.
    version, topic, broker, millis, msg_id = base64.urlsafe_b64decode(sent.recall_handle).split()
    assert (version, topic, broker, msg_id) == (
        b"v1",
        setup.topic.encode(),
        b"txhub",
        sent.message_id.encode(),
    )
    assert int(millis) == due * 1000

    assert producer.recall_message(setup.topic, sent.recall_handle) == sent.message_id
    # Again: the same answer (decision 0055).
    assert producer.recall_message(setup.topic, sent.recall_handle) == sent.message_id
    recalled = RecalledMessage.objects.get(msg_id=sent.message_id)
    assert (recalled.door, recalled.recalled_by, recalled.producer_group) == (
        "grpc",
        "rocketmq",
        setup.producer,
    )
    assert not DelayedMessage.objects.exists()
    assert delivery.delayed_deliver_due() == 0
    assert not CommitLogEntry.objects.filter(msg_id=sent.message_id).exists()

    # A message in the commit log is not recalled: the client raises the server's sentence.
    with pytest.raises(BadRequestException, match="commit log"):
        producer.recall_message(setup.topic, handle_for(setup.topic, normal.message_id))


def test_recall_message_refusals(grpc_server: GrpcServer, rocketmq_setup: Any) -> None:
    setup = rocketmq_setup("-refused")
    other = rocketmq_setup("-other")
    consumer_only, _ = registry.token_create(name="reader", scopes=[f"consume:{setup.consumer}"])
    with grpc.insecure_channel(grpc_server.endpoint) as channel:
        stub = MessagingServiceStub(channel)

        def recall(who: Any, handle: str, topic: str = setup.topic) -> Any:
            request = rpc.RecallMessageRequest(topic=pb.Resource(name=topic), recall_handle=handle)
            return stub.RecallMessage(request, metadata=signed(grpc_server, who))

        send = rpc.SendMessageRequest()
        item = send.messages.add()
        item.topic.name = setup.topic
        item.body = b"delayed"
        item.system_properties.message_id = "01RECALLREFUSED0000000000000000001"
        item.system_properties.message_type = pb.DELAY
        item.system_properties.delivery_timestamp.seconds = int(time.time()) + 60
        sent = stub.SendMessage(send, metadata=signed(grpc_server, setup))
        assert sent.status.code == pb.Code.OK, sent.status
        handle = sent.entries[0].recall_handle
        assert handle

        answers = {
            "junk": (recall(setup, "x"), pb.Code.BAD_REQUEST),
            "not base64": (recall(setup, "%%%"), pb.Code.BAD_REQUEST),
            "six fields": (recall(setup, handle_for(setup.topic, "A B")), pb.Code.BAD_REQUEST),
            "another topic": (recall(setup, handle, other.topic), pb.Code.BAD_REQUEST),
            "unknown": (recall(setup, handle_for(setup.topic, "0" * 32)), pb.Code.NOT_FOUND),
            "no produce scope": (recall(consumer_only, handle), pb.Code.FORBIDDEN),
        }
        # The message under another topic of its own group in the handle: as unknown.
        registry.topic_create(name=f"{setup.topic}-2", queues=1)
        elsewhere = handle_for(f"{setup.topic}-2", sent.entries[0].message_id)
        answers["its group's other topic"] = (
            recall(setup, elsewhere, f"{setup.topic}-2"),
            pb.Code.NOT_FOUND,
        )
        # Another tenant's message under its own topic in the handle: as unknown.
        theirs = recall(other, handle_for(setup.topic, sent.entries[0].message_id))
        answers["another tenant's message"] = (theirs, pb.Code.NOT_FOUND)
        for name, (answer, code) in answers.items():
            assert answer.status.code == code, (name, answer.status)
            assert answer.status.message, name
        assert DelayedMessage.objects.filter(msg_id=sent.entries[0].message_id).exists()
        assert not RecalledMessage.objects.exists()

        ok = recall(setup, handle)
        assert ok.status.code == pb.Code.OK, ok.status
        assert ok.message_id == sent.entries[0].message_id
