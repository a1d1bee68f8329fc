"""A consumer giving up on a message (ForwardMessageToDeadLetterQueue) at the gRPC door, found by
the mutation review of decision 0112: the handle acts only for the topic the request names; the
dead letter is dated, so the dead-letter queue the REST door lists shows when; and in a FIFO group
it frees the message group's next message at once, announced to the receives that wait (decision
0054). Raw stubs on the real gRPC server, signed as the official client signs."""

from datetime import datetime
from typing import Any

import psycopg
import pytest
from django.utils import timezone
from rest_framework.test import APIClient
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import Delivery, Topic
from apps.broker.services import registry
from apps.broker.services.sending import RECEIVABLE_CHANNEL
from tests.conftest import client_for, db_url_for_tests
from tests.grpc.conftest import GrpcServer, Setup
from tests.support.grpc import signed

pytestmark = pytest.mark.e2e


def send(setup: Setup, body: str, **fields: Any) -> str:
    rest: APIClient = client_for(f"produce:{setup.producer}")
    payload = {"producer_group": setup.producer, "body": body, **fields}
    sent = rest.post(f"/api/v1/topics/{setup.topic}/messages", payload, format="json")
    assert sent.status_code == 201, sent.content
    return str(sent.json()["msg_id"])


def receive_one(stub: MessagingServiceStub, meta: Any, setup: Setup) -> Any:
    request = rpc.ReceiveMessageRequest(
        group=pb.Resource(name=setup.consumer),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=setup.topic), id=-1),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
        batch_size=1,
    )
    request.long_polling_timeout.seconds = 5
    head, *messages = list(stub.ReceiveMessage(request, metadata=meta))
    assert head.status.code == pb.Code.OK, head.status
    return messages[0].message


def forward(
    stub: MessagingServiceStub, meta: Any, setup: Setup, message: Any, topic: str = ""
) -> Any:
    request = rpc.ForwardMessageToDeadLetterQueueRequest(
        group=pb.Resource(name=setup.consumer),
        topic=pb.Resource(name=topic or setup.topic),
        receipt_handle=message.system_properties.receipt_handle,
        message_id=message.system_properties.message_id,
        delivery_attempt=1,
        max_delivery_attempts=16,
    )
    return stub.ForwardMessageToDeadLetterQueue(request, metadata=meta).status


def test_a_handle_is_forwarded_only_under_its_own_topic_and_the_dead_letter_is_dated(
    grpc_server: GrpcServer, rocketmq_setup: Any, stub: MessagingServiceStub
) -> None:
    setup = rocketmq_setup("-fwd-topic")
    registry.topic_create(name="elsewhere-fwd-topic", queues=1)  # the group may consume it too
    meta = signed(grpc_server, setup, "raw-client")
    msg_id = send(setup, "give up on me")
    message = receive_one(stub, meta, setup)
    wrong = forward(stub, meta, setup, message, topic="elsewhere-fwd-topic")
    assert wrong.code == pb.Code.INVALID_RECEIPT_HANDLE, wrong
    assert Delivery.objects.get().state == "INFLIGHT"
    before = timezone.now()
    right = forward(stub, meta, setup, message)
    assert right.code == pb.Code.OK, right
    rest: APIClient = client_for(f"consume:{setup.consumer}")
    listed = rest.get(f"/api/v1/consumer-groups/{setup.consumer}/dlq")
    assert listed.status_code == 200, listed.content
    [entry] = listed.json()["results"]
    assert entry["msg_id"] == msg_id
    assert before <= datetime.fromisoformat(entry["dlq_at"]) <= timezone.now()


def test_a_fifo_message_forwarded_frees_and_announces_its_groups_next(
    grpc_server: GrpcServer, rocketmq_setup: Any, stub: MessagingServiceStub
) -> None:
    setup = rocketmq_setup("-fwd-fifo", fifo=True)
    meta = signed(grpc_server, setup, "raw-client")
    first = send(setup, "x1", message_group="x")
    second = send(setup, "x2", message_group="x")
    head = receive_one(stub, meta, setup)
    assert head.system_properties.message_id == first
    topic_id = Topic.objects.get(name=setup.topic).pk
    with psycopg.connect(db_url_for_tests(), autocommit=True) as listening:
        listening.execute(f"LISTEN {RECEIVABLE_CHANNEL}")
        assert forward(stub, meta, setup, head).code == pb.Code.OK
        payloads = [n.payload for n in listening.notifies(timeout=10, stop_after=1)]
    assert payloads == [f"{topic_id} released"]
    assert receive_one(stub, meta, setup).system_properties.message_id == second
