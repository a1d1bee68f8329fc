"""The official RocketMQ Python client (rocketmq-python-client, pinned), unchanged, against the
real gRPC server on the test database."""

import base64
import time
from typing import Any

import grpc
import pytest
from rest_framework.test import APIClient
from rocketmq import (
    FilterExpression,
    Producer,
    SimpleConsumer,
)
from rocketmq.grpc_protocol import Code, MessagingServiceStub, QueryRouteRequest, SendMessageRequest
from rocketmq.v5.exception import BadRequestException, UnauthorizedException
from rocketmq.v5.util.signature import Signature

from apps.broker.models import CommitLogEntry, HalfMessage
from apps.broker.services import registry
from tests.conftest import client_for
from tests.grpc.conftest import GrpcServer
from tests.support.grpc import Checker, config, message, receive_all, start

pytestmark = pytest.mark.e2e


def test_sends_transactions_and_receives_with_the_python_client(
    grpc_server: GrpcServer, celery_module: Any, rocketmq_setup: Any, clients: list[Any]
) -> None:
    """Celery: the delayed message is moved into the commit log by the delivery scan."""
    setup = rocketmq_setup()
    producer = start(clients, Producer(config(grpc_server, setup), (setup.topic,), Checker()))
    normal = producer.send(
        message(setup.topic, b"normal", "TagA", keys=["k1"], properties={"p": "v"})
    )
    committed_tx = producer.begin_transaction()
    committed = producer.send(message(setup.topic, b"committed", "TagA"), committed_tx)
    committed_tx.commit()
    rolled_back_tx = producer.begin_transaction()
    rolled_back = producer.send(message(setup.topic, b"rolled back", "TagA"), rolled_back_tx)
    rolled_back_tx.rollback()
    due = int(time.time()) + 3
    delayed = producer.send(message(setup.topic, b"delayed", "TagA", delivery_timestamp=due))

    # The client's ids are txhub's: message ids and the transaction id.
    half = HalfMessage.objects.get(msg_id=committed.message_id)
    assert str(half.transaction_id) == committed.transaction_id
    assert half.state == "COMMITTED"
    assert half.resolved_by == "PRODUCER"
    assert HalfMessage.objects.get(msg_id=rolled_back.message_id).state == "ROLLED_BACK"

    consumer = start(
        clients,
        SimpleConsumer(
            config(grpc_server, setup),
            setup.consumer,
            {setup.topic: FilterExpression("TagA || TagB")},
            await_duration=5,
        ),
    )
    first = receive_all(consumer, 2)
    assert sorted(m.message_id for m in first) == sorted([normal.message_id, committed.message_id])
    by_id = {m.message_id: m for m in first}
    got = by_id[normal.message_id]
    assert (got.body, got.tag, got.keys, got.properties) == (b"normal", "TagA", {"k1"}, {"p": "v"})
    assert got.delivery_attempt == 1
    for item in first:
        consumer.ack(item)
    later = receive_all(consumer, 1)
    # The delayed message: never before its delivery time (database clock), then delivered.
    assert [m.message_id for m in later] == [delayed.message_id]
    entry = CommitLogEntry.objects.get(msg_id=delayed.message_id)
    assert entry.stored_at.timestamp() >= due
    consumer.ack(later[0])
    assert not CommitLogEntry.objects.filter(msg_id=rolled_back.message_id).exists()


def test_a_retried_send_with_the_same_message_id_is_stored_once(
    grpc_server: GrpcServer, rocketmq_setup: Any, clients: list[Any]
) -> None:
    setup = rocketmq_setup()
    producer = start(clients, Producer(config(grpc_server, setup), (setup.topic,)))
    sent = producer.send(message(setup.topic, b"once", "TagA"))
    # The same request again, as the client's retry would send it (same message id).
    request = SendMessageRequest()
    item = request.messages.add()
    item.topic.name = setup.topic
    item.body = b"once"
    item.system_properties.message_id = sent.message_id
    item.system_properties.message_type = 1  # NORMAL
    with grpc.insecure_channel(grpc_server.endpoint) as channel:
        answer = MessagingServiceStub(channel).SendMessage(
            request, metadata=Signature.metadata(config(grpc_server, setup), "retry-client")
        )
    assert answer.status.code == Code.OK, answer.status
    assert answer.entries[0].message_id == sent.message_id
    assert CommitLogEntry.objects.filter(msg_id=sent.message_id).count() == 1


def test_simple_consumer_gets_an_unacked_message_again_and_changes_invisible_time(
    grpc_server: GrpcServer, rocketmq_setup: Any, clients: list[Any]
) -> None:
    setup = rocketmq_setup()
    producer = start(clients, Producer(config(grpc_server, setup), (setup.topic,)))
    first = producer.send(message(setup.topic, b"redelivered"))
    second = producer.send(message(setup.topic, b"changed"))
    consumer = start(
        clients,
        SimpleConsumer(
            config(grpc_server, setup), setup.consumer, {setup.topic: FilterExpression("*")}, 5
        ),
    )
    got = {m.message_id: m for m in receive_all(consumer, 2, invisible=10)}
    assert set(got) == {first.message_id, second.message_id}
    old_handle = got[second.message_id].receipt_handle
    consumer.change_invisible_duration(got[second.message_id], 60)
    assert got[second.message_id].receipt_handle != old_handle
    consumer.ack(got[second.message_id])  # the new handle acks
    again = receive_all(consumer, 1, invisible=10, timeout=40)  # after the 10 s invisible time
    assert [(m.message_id, m.delivery_attempt) for m in again] == [(first.message_id, 2)]
    consumer.ack(again[0])
    with pytest.raises(BadRequestException):
        consumer.ack(got[first.message_id])  # the first receive's handle no longer acks


def test_messages_cross_between_rest_and_grpc(
    grpc_server: GrpcServer, rocketmq_setup: Any, clients: list[Any]
) -> None:
    setup = rocketmq_setup()
    rest: APIClient = client_for(f"produce:{setup.producer}", f"consume:{setup.consumer}")
    body = {
        "producer_group": setup.producer,
        "body_base64": base64.b64encode(b"\x00\xffbinary").decode(),
        "tags": "TagR",
        "keys": ["rk"],
        "properties": {"from": "rest"},
    }
    sent_rest = rest.post(f"/api/v1/topics/{setup.topic}/messages", body, format="json")
    assert sent_rest.status_code == 201, sent_rest.content
    # A tag filter passes other tags over for the group (as in RocketMQ): "*" on both sides.
    consumer = start(
        clients,
        SimpleConsumer(
            config(grpc_server, setup), setup.consumer, {setup.topic: FilterExpression("*")}, 5
        ),
    )
    [got] = receive_all(consumer, 1)
    assert got.message_id == sent_rest.json()["msg_id"]
    assert (got.body, got.tag, got.keys, got.properties) == (
        b"\x00\xffbinary",
        "TagR",
        {"rk"},
        {"from": "rest"},
    )
    consumer.ack(got)
    producer = start(clients, Producer(config(grpc_server, setup), (setup.topic,)))
    sent_grpc = producer.send(
        message(setup.topic, b"from grpc", "TagG", keys=["gk"], properties={"from": "grpc"})
    )
    # REST finds the gRPC message by the client's message id.
    trace = rest.get(f"/api/v1/messages/{sent_grpc.message_id}")
    assert trace.status_code == 200, trace.content
    received = rest.post(
        f"/api/v1/consumer-groups/{setup.consumer}/receive",
        {"topic": setup.topic, "wait_seconds": 5},
        format="json",
    )
    assert received.status_code == 200, received.content
    [item] = received.json()["messages"]
    assert item["msg_id"] == sent_grpc.message_id
    assert (item["body"], item["tags"], item["keys"], item["properties"]) == (
        "from grpc",
        "TagG",
        ["gk"],
        {"from": "grpc"},
    )


def test_a_wrong_secret_and_a_revoked_token_are_refused(
    grpc_server: GrpcServer, rocketmq_setup: Any, clients: list[Any]
) -> None:
    setup = rocketmq_setup()
    bad = config(grpc_server, setup, secret="txsk_not-the-secret")
    wrong = start(clients, Producer(bad, (setup.topic,)))
    # The client logs the UNAUTHORIZED route answer and then has no route to send with.
    with pytest.raises(Exception, match="route"):
        wrong.send(message(setup.topic, b"refused"))
    request = QueryRouteRequest()
    request.topic.name = setup.topic
    with grpc.insecure_channel(grpc_server.endpoint) as channel:
        answer = MessagingServiceStub(channel).QueryRoute(
            request, metadata=Signature.metadata(bad, "wrong-secret-client")
        )
    assert answer.status.code == Code.UNAUTHORIZED, answer.status
    producer = start(clients, Producer(config(grpc_server, setup), (setup.topic,)))
    producer.send(message(setup.topic, b"accepted"))
    registry.token_revoke(token_id=setup.token_id)
    with pytest.raises(UnauthorizedException):
        producer.send(message(setup.topic, b"after revocation"))
