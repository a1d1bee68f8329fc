"""A transactional message's `delivery_timestamp` at the gRPC door is kept and applied from the
commit on, as a REST prepare's `deliver_at` is; a time the service refuses stores nothing
(docs/decisions/0117). Raw signed stubs on the real gRPC server: the official clients refuse
the pair themselves, as RocketMQ's do."""

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import grpc
import pytest
from django.conf import settings
from django.utils import timezone
from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import CommitLogEntry, DelayedMessage, HalfMessage
from apps.broker.services import registry
from tests.grpc.conftest import GrpcServer, Setup
from tests.support.grpc import signed

pytestmark = pytest.mark.e2e


def prepare(
    stub: Any, meta: Any, topic: str, body: bytes, deliver_at: datetime, group: str = ""
) -> Any:
    stamp = Timestamp()
    stamp.FromDatetime(deliver_at)
    system = pb.SystemProperties(
        message_id="01" + uuid.uuid4().hex.upper(),
        message_type=pb.TRANSACTION,
        delivery_timestamp=stamp,
    )
    if group:
        system.message_group = group
    request = rpc.SendMessageRequest(
        messages=[pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=system)]
    )
    return stub.SendMessage(request, metadata=meta)


def producer(grpc_server: GrpcServer, make: Callable[..., Setup]) -> tuple[str, Any]:
    setup = make()
    token = registry.token_create(name="producer", scopes=[f"produce:{setup.producer}"])[0]
    return setup.topic, signed(grpc_server, token)


def test_a_transactions_delivery_time_is_kept_and_applied_from_the_commit(
    grpc_server: GrpcServer, rocketmq_setup: Callable[..., Setup]
) -> None:
    topic, meta = producer(grpc_server, rocketmq_setup)
    deliver_at = (timezone.now() + timedelta(hours=1)).replace(microsecond=0)
    with grpc.insecure_channel(grpc_server.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        answer = prepare(stub, meta, topic, b"later", deliver_at)
        assert answer.status.code == pb.OK, answer.status
        [entry] = answer.entries
        half = HalfMessage.objects.get(transaction_id=entry.transaction_id)
        assert half.deliver_at == deliver_at
        end = rpc.EndTransactionRequest(
            topic=pb.Resource(name=topic),
            message_id=entry.message_id,
            transaction_id=entry.transaction_id,
            resolution=pb.COMMIT,
            source=pb.SOURCE_CLIENT,
        )
        assert stub.EndTransaction(end, metadata=meta).status.code == pb.OK
    # Committed, and waiting for its time: not in the commit log before it.
    delayed = DelayedMessage.objects.get(transaction_id=entry.transaction_id)
    assert (delayed.msg_id, delayed.deliver_at) == (entry.message_id, deliver_at)
    assert not CommitLogEntry.objects.filter(msg_id=entry.message_id).exists()


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("past TXHUB_MAX_DELAY", pb.ILLEGAL_DELIVERY_TIME),
        ("with a message group", pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    ],
)
def test_a_delivery_time_the_service_refuses_stores_nothing(
    grpc_server: GrpcServer, rocketmq_setup: Callable[..., Setup], case: str, code: int
) -> None:
    topic, meta = producer(grpc_server, rocketmq_setup)
    later = timezone.now() + timedelta(hours=1)
    too_late = timezone.now() + timedelta(seconds=settings.TXHUB_MAX_DELAY + 3600)
    group = "order-9527" if case == "with a message group" else ""
    with grpc.insecure_channel(grpc_server.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        body = b"refused"
        answer = prepare(stub, meta, topic, body, too_late if not group else later, group)
        assert (answer.status.code, answer.entries[0].status.code) == (code, code)
        assert "delivery time" in answer.status.message or "delayed" in answer.status.message
        # Positive control: the same message without the refused part is stored.
        control = prepare(stub, meta, topic, b"control", later)
        assert control.status.code == pb.OK, control.status
    assert not HalfMessage.objects.filter(body=body).exists()
    assert HalfMessage.objects.filter(body=b"control").count() == 1
