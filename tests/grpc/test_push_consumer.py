"""PushConsumer support: assignments, nack with the announced backoff, the dead-letter queue the
REST API shows, and UNSUPPORTED (never gRPC UNIMPLEMENTED) for what txhub does not serve."""

import threading
import time
from typing import Any

import pytest
from rest_framework.test import APIClient
from rocketmq import ConsumeResult, FilterExpression, MessageListener, Producer, PushConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import Delivery
from tests.conftest import client_for
from tests.grpc.conftest import GrpcServer
from tests.support.grpc import config, message, signed, start
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


class Listener(MessageListener):  # type: ignore[misc]
    """Fails a message whose body starts with "poison" on its first `failures` deliveries."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.lock = threading.Lock()
        self.seen: dict[str, list[tuple[int, float]]] = {}

    def consume(self, message: Any) -> Any:
        with self.lock:
            deliveries = self.seen.setdefault(message.message_id, [])
            deliveries.append((message.delivery_attempt, time.monotonic()))
            failing = message.body.startswith(b"poison") and len(deliveries) <= self.failures
        return ConsumeResult.FAILURE if failing else ConsumeResult.SUCCESS

    def count(self, msg_id: str) -> int:
        with self.lock:
            return len(self.seen.get(msg_id, []))


def test_push_consumer_retries_a_failure_with_the_backoff_then_dead_letters_it(
    grpc_server: GrpcServer, rocketmq_setup: Any, clients: list[Any]
) -> None:
    """The group allows 2 deliveries; the server announces a 1 s, then 2 s backoff."""
    setup = rocketmq_setup("-push", max_delivery_attempts=2)
    producer = start(clients, Producer(config(grpc_server, setup), (setup.topic,)))
    good = producer.send(message(setup.topic, b"fine"))
    poison = producer.send(message(setup.topic, b"poison pill"))
    listener = Listener(failures=2)
    start(
        clients,
        PushConsumer(
            config(grpc_server, setup),
            setup.consumer,
            listener,
            {setup.topic: FilterExpression("*")},
            consumption_thread_count=2,
        ),
    )
    rest: APIClient = client_for(f"consume:{setup.consumer}")

    def dead_lettered() -> list[Any]:
        answer = rest.get(f"/api/v1/consumer-groups/{setup.consumer}/dlq")
        assert answer.status_code == 200, answer.content
        return list(answer.json()["results"])

    [entry] = wait_until(dead_lettered, timeout=60, interval=0.5)
    assert (entry["msg_id"], entry["attempts"]) == (poison.message_id, 2)
    attempts = listener.seen[poison.message_id]
    assert [attempt for attempt, _ in attempts] == [1, 2]
    # The nack asked for the announced backoff's first delay (1 s) before the second delivery.
    assert attempts[1][1] - attempts[0][1] >= 0.9
    assert [a for a, _ in listener.seen[good.message_id]] == [1]
    assert Delivery.objects.get(message__msg_id=good.message_id).state == "ACKED"

    # An operator resends it from the DLQ: the PushConsumer gets it again, now consumes it.
    resent = rest.post(f"/api/v1/consumer-groups/{setup.consumer}/dlq/{poison.message_id}/resend")
    assert resent.status_code == 200, resent.content
    assert wait_until(lambda: listener.count(poison.message_id) == 3, timeout=60)
    assert listener.seen[poison.message_id][2][0] == 1  # a fresh attempt count
    done = wait_until(
        lambda: Delivery.objects.get(message__msg_id=poison.message_id).state == "ACKED",
        timeout=30,
    )
    assert done


def test_assignment_is_one_queue_for_all_and_forward_moves_to_the_rest_dlq(
    grpc_server: GrpcServer, rocketmq_setup: Any, stub: MessagingServiceStub
) -> None:
    setup = rocketmq_setup("-fwd")
    meta = signed(grpc_server, setup, "raw-client")
    query = rpc.QueryAssignmentRequest(
        topic=pb.Resource(name=setup.topic), group=pb.Resource(name=setup.consumer)
    )
    answer = stub.QueryAssignment(query, metadata=meta)
    assert answer.status.code == pb.Code.OK, answer.status
    [assignment] = answer.assignments
    assert (assignment.message_queue.topic.name, assignment.message_queue.id) == (setup.topic, -1)
    assert assignment.message_queue.permission == pb.READ_WRITE
    missing = stub.QueryAssignment(
        rpc.QueryAssignmentRequest(
            topic=pb.Resource(name="no-such-topic"), group=pb.Resource(name=setup.consumer)
        ),
        metadata=meta,
    )
    assert missing.status.code == pb.Code.TOPIC_NOT_FOUND, missing.status

    rest: APIClient = client_for(f"produce:{setup.producer}", f"consume:{setup.consumer}")
    sent = rest.post(
        f"/api/v1/topics/{setup.topic}/messages",
        {"producer_group": setup.producer, "body": "give up on me"},
        format="json",
    )
    assert sent.status_code == 201, sent.content
    receive = rpc.ReceiveMessageRequest(
        group=pb.Resource(name=setup.consumer),
        message_queue=assignment.message_queue,
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
        batch_size=1,
    )
    receive.long_polling_timeout.seconds = 5
    [head, got, _] = list(stub.ReceiveMessage(receive, metadata=meta))
    assert head.status.code == pb.Code.OK, head.status
    handle = got.message.system_properties.receipt_handle

    def forward(receipt_handle: str) -> Any:
        request = rpc.ForwardMessageToDeadLetterQueueRequest(
            group=pb.Resource(name=setup.consumer),
            topic=pb.Resource(name=setup.topic),
            receipt_handle=receipt_handle,
            message_id=got.message.system_properties.message_id,
            delivery_attempt=1,
            max_delivery_attempts=16,
        )
        return stub.ForwardMessageToDeadLetterQueue(request, metadata=meta)

    forwarded = forward(handle)
    assert forwarded.status.code == pb.Code.OK, forwarded.status
    dlq = rest.get(f"/api/v1/consumer-groups/{setup.consumer}/dlq")
    assert dlq.status_code == 200, dlq.content
    assert [e["msg_id"] for e in dlq.json()["results"]] == [sent.json()["msg_id"]]
    # The handle no longer holds the message: forwarding (or acking) it again is refused.
    again = forward(handle)
    assert again.status.code == pb.Code.INVALID_RECEIPT_HANDLE, again.status


def test_what_txhub_does_not_serve_answers_unsupported(
    grpc_server: GrpcServer, rocketmq_setup: Any, stub: MessagingServiceStub
) -> None:
    setup = rocketmq_setup("-unsup")
    meta = signed(grpc_server, setup, "raw-client")
    group, topic = pb.Resource(name=setup.consumer), pb.Resource(name=setup.topic)
    queue = pb.MessageQueue(topic=topic, id=0)
    answers = {
        "UpdateOffset": stub.UpdateOffset(
            rpc.UpdateOffsetRequest(group=group, message_queue=queue, offset=1), metadata=meta
        ),
        "GetOffset": stub.GetOffset(
            rpc.GetOffsetRequest(group=group, message_queue=queue), metadata=meta
        ),
        "QueryOffset": stub.QueryOffset(rpc.QueryOffsetRequest(message_queue=queue), metadata=meta),
    }
    [pulled] = list(
        stub.PullMessage(rpc.PullMessageRequest(group=group, message_queue=queue), metadata=meta)
    )
    answers["PullMessage"] = pulled
    sql = rpc.ReceiveMessageRequest(
        group=group,
        message_queue=queue,
        filter_expression=pb.FilterExpression(type=pb.SQL, expression="a > 1"),
    )
    [answers["ReceiveMessage SQL92"]] = list(stub.ReceiveMessage(sql, metadata=meta))
    for name, answer in answers.items():
        assert answer.status.code == pb.Code.UNSUPPORTED, (name, answer.status)
        assert "not supported" in answer.status.message, (name, answer.status)
