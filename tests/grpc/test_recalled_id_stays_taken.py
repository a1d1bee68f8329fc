"""A recalled message keeps its id (docs/decisions/0075): a gRPC producer's send reusing the
client-chosen id of a message recalled at either door (REST `POST /messages/{id}/recall`, gRPC
RecallMessage) is refused as a send reusing any stored id and stores nothing, another group's
send of it takes its scoped id (decision 0040), and a recall of the id again answers the first
recall instead of failing on the recalled table's unique index. Raw stubs on the real gRPC
server and real HTTP against gunicorn, on the test database."""

import base64
import time
import uuid
from typing import Any

import pytest
import requests
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import (
    CommitLogEntry,
    DelayedMessage,
    HalfMessage,
    RecalledMessage,
)
from tests.conftest import Server
from tests.grpc.conftest import GrpcServer, Setup
from tests.support.grpc import signed
from tests.support.responses import assert_error, expect

pytestmark = pytest.mark.e2e


def client_id() -> str:
    """A RocketMQ client's id: "01" and 32 hex characters."""
    return "01" + uuid.uuid4().hex.upper()


def send(
    stub: MessagingServiceStub, meta: Any, topic: str, msg_id: str, kind: str = "delayed"
) -> Any:
    """SendMessage of one message under the client's id `msg_id`: "delayed" (a minute away),
    "normal" (visible at once) or "transaction" (a half message)."""
    request = rpc.SendMessageRequest()
    item = request.messages.add()
    item.topic.name = topic
    item.body = f"{kind} {msg_id}".encode()
    item.system_properties.message_id = msg_id
    if kind == "delayed":
        item.system_properties.message_type = pb.DELAY
        item.system_properties.delivery_timestamp.seconds = int(time.time()) + 60
    elif kind == "transaction":
        item.system_properties.message_type = pb.TRANSACTION
    else:
        item.system_properties.message_type = pb.NORMAL
    return stub.SendMessage(request, metadata=meta)


def grpc_recall(stub: MessagingServiceStub, meta: Any, topic: str, handle: str) -> Any:
    request = rpc.RecallMessageRequest(topic=pb.Resource(name=topic), recall_handle=handle)
    return stub.RecallMessage(request, metadata=meta)


def handle_for(topic: str, msg_id: str) -> str:
    raw = f"v1 {topic} txhub {int(time.time() * 1000)} {msg_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode()


def stored_under(msg_id: str) -> dict[str, int]:
    """How many rows of each table that stores a message hold `msg_id`."""
    return {
        "commit log": CommitLogEntry.objects.filter(msg_id=msg_id).count(),
        "delayed": DelayedMessage.objects.filter(msg_id=msg_id).count(),
        "half": HalfMessage.objects.filter(msg_id=msg_id).count(),
        "recalled": RecalledMessage.objects.filter(msg_id=msg_id).count(),
    }


def assert_resends_refused(
    stub: MessagingServiceStub, meta: Any, setup: Setup, msg_id: str
) -> None:
    """Every kind of send of the recalled id is refused with a sentence, and stores nothing."""
    for kind in ("delayed", "normal", "transaction"):
        answer = send(stub, meta, setup.topic, msg_id, kind)
        assert answer.status.code == pb.Code.BAD_REQUEST, (kind, answer.status)
        assert "recalled" in answer.status.message, (kind, answer.status)
        assert answer.entries[0].status.code == pb.Code.BAD_REQUEST, kind
    assert stored_under(msg_id) == {"commit log": 0, "delayed": 0, "half": 0, "recalled": 1}


def assert_fresh_id_accepted(stub: MessagingServiceStub, meta: Any, setup: Setup) -> None:
    """Positive control: a fresh client id is kept as sent."""
    fresh = client_id()
    answer = send(stub, meta, setup.topic, fresh)
    assert answer.status.code == pb.Code.OK, answer.status
    assert answer.entries[0].message_id == fresh
    assert stored_under(fresh)["delayed"] == 1


def assert_another_group_takes_its_scoped_id(
    grpc_server: GrpcServer, stub: MessagingServiceStub, other: Setup, msg_id: str
) -> None:
    """Another group's send of the recalled id is stored under its own scoped id (0040)."""
    answer = send(stub, signed(grpc_server, other), other.topic, msg_id)
    assert answer.status.code == pb.Code.OK, answer.status
    scoped = answer.entries[0].message_id
    assert scoped != msg_id
    assert stored_under(scoped)["delayed"] == 1


def test_a_message_recalled_over_rest_keeps_its_id(
    grpc_server: GrpcServer, rocketmq_setup: Any, stub: MessagingServiceStub, server: Server
) -> None:
    setup, other = rocketmq_setup("-rest"), rocketmq_setup("-rest-other")
    meta = signed(grpc_server, setup)
    msg_id = client_id()
    assert send(stub, meta, setup.topic, msg_id).status.code == pb.Code.OK
    producer = server.token(f"produce:{setup.producer}")
    path = server.url(f"/api/v1/messages/{msg_id}/recall")
    first = expect(requests.post(path, headers=producer, timeout=30), 200)
    assert first["door"] == "rest"

    assert_resends_refused(stub, meta, setup, msg_id)
    # Recalled again: the first recall, unchanged (decision 0055), not a 500.
    assert expect(requests.post(path, headers=producer, timeout=30), 200) == first
    assert_fresh_id_accepted(stub, meta, setup)
    assert_another_group_takes_its_scoped_id(grpc_server, stub, other, msg_id)


def test_a_message_recalled_over_grpc_keeps_its_id(
    grpc_server: GrpcServer, rocketmq_setup: Any, stub: MessagingServiceStub
) -> None:
    setup, other = rocketmq_setup("-grpc"), rocketmq_setup("-grpc-other")
    meta = signed(grpc_server, setup)
    msg_id = client_id()
    sent = send(stub, meta, setup.topic, msg_id)
    assert sent.status.code == pb.Code.OK, sent.status
    handle = sent.entries[0].recall_handle
    recalled = grpc_recall(stub, meta, setup.topic, handle)
    assert (recalled.status.code, recalled.message_id) == (pb.Code.OK, msg_id)
    first = RecalledMessage.objects.get(msg_id=msg_id)

    assert_resends_refused(stub, meta, setup, msg_id)
    # Recalled again (with a handle of a later time): the first recall, not INTERNAL_ERROR.
    again = grpc_recall(stub, meta, setup.topic, handle_for(setup.topic, msg_id))
    assert (again.status.code, again.message_id) == (pb.Code.OK, msg_id), again.status
    assert RecalledMessage.objects.get(msg_id=msg_id).recalled_at == first.recalled_at
    assert_fresh_id_accepted(stub, meta, setup)
    assert_another_group_takes_its_scoped_id(grpc_server, stub, other, msg_id)


def test_a_message_stored_under_a_recalled_id_before_0075_is_a_conflict_to_recall(
    grpc_server: GrpcServer, rocketmq_setup: Any, stub: MessagingServiceStub, server: Server
) -> None:
    """Rows stored before decision 0075 (a recalled id sent again as a delayed message): its
    recall is a 409 with a sentence at REST and BAD_REQUEST at gRPC, not an IntegrityError, and
    it stays where it was."""
    setup = rocketmq_setup("-legacy")
    meta = signed(grpc_server, setup)
    msg_id = client_id()
    sent = send(stub, meta, setup.topic, msg_id)
    assert grpc_recall(stub, meta, setup.topic, sent.entries[0].recall_handle).status.code == (
        pb.Code.OK
    )
    recalled = RecalledMessage.objects.get(msg_id=msg_id)
    # As a send before 0075 stored it: the recalled id did not count as held.
    DelayedMessage.objects.create(
        msg_id=msg_id,
        topic_id=recalled.topic_id,
        queue_id=recalled.queue_id,
        producer_group=recalled.producer_group,
        body=b"sent again",
        deliver_at=recalled.deliver_at,
    )

    producer = server.token(f"produce:{setup.producer}")
    path = server.url(f"/api/v1/messages/{msg_id}/recall")
    answer = requests.post(path, headers=producer, timeout=30)
    assert_error(answer, 409, "conflict")
    assert "earlier message" in answer.json()["error"]["message"]
    refused = grpc_recall(stub, meta, setup.topic, handle_for(setup.topic, msg_id))
    assert refused.status.code == pb.Code.BAD_REQUEST, refused.status
    assert "earlier message" in refused.status.message
    assert stored_under(msg_id) == {"commit log": 0, "delayed": 1, "half": 0, "recalled": 1}
