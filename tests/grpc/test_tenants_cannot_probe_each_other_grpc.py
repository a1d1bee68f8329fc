"""Tenant A's signed client learns nothing of tenant B's objects at the gRPC door, and changes
none of them (docs/decisions/0046, 0090, 0099): each RPC naming B's topic, group, transaction id,
receipt handle or recall handle answers A exactly as a made-up name or id does (the names
themselves aside), B's rows are as they were, and B's own client still uses each of them (the
positive control). A client id B holds, named by A, is a client of A's and B's stays as it was
(docs/decisions/0034, 0100).
Raw stubs on the real gRPC server, signed as the official client signs."""

import base64
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import (
    CommitLogEntry,
    DelayedMessage,
    Delivery,
    GrpcClient,
    HalfMessage,
    RecalledMessage,
)
from apps.broker.services import registry
from tests.grpc.conftest import GrpcServer, Setup
from tests.support.grpc import Telemetry, raw_message, signed

pytestmark = pytest.mark.e2e

NO_TOPIC, NO_GROUP = "no-such-topic", "no-such-group"
NO_MESSAGE = "0" * 32
B_CLIENT = "tenant-b-host@4242@0@producer"


@dataclass
class Tenants:
    a: Setup
    b: Setup
    a_meta: list[tuple[str, str]]
    b_meta: list[tuple[str, str]]
    transaction_id: str
    recall_handle: str
    delayed_id: str
    receipt_handle: str
    received_id: str


def said(answer: Any, *names: str) -> tuple[int, str]:
    """A status's code and message, with the names that differ by design made alike."""
    message = answer.message
    for name in names:
        message = message.replace(name, "<name>")
    return answer.code, message


def recall_handle_for(topic: str, msg_id: str) -> str:
    raw = f"v1 {topic} txhub {int(time.time() * 1000) + 60_000} {msg_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode()


def b_rows(t: Tenants) -> dict[str, Any]:
    """What of B's a call of A's could change."""
    half = HalfMessage.objects.get(transaction_id=t.transaction_id)
    held = Delivery.objects.get(message__msg_id=t.received_id)
    client = GrpcClient.objects.get(client_id=B_CLIENT, token_id=t.b.token_id)
    return {
        "half": (half.state, half.resolved_by),
        "delayed": DelayedMessage.objects.filter(msg_id=t.delayed_id).exists(),
        "recalled": RecalledMessage.objects.count(),
        "sent to b": CommitLogEntry.objects.filter(topic__name=t.b.topic).count(),
        "delivery": (held.state, held.handle_token, held.invisible_until, held.attempts),
        "client": (client.token_id, client.group, client.stream_process, client.seen_at),
    }


@pytest.fixture
def tenants(
    grpc_server: GrpcServer, rocketmq_setup: Callable[..., Setup], stub: MessagingServiceStub
) -> Tenants:
    a, b = rocketmq_setup("-a"), rocketmq_setup("-b")
    registry.producer_group_bind_topics(name=a.producer, topics=[a.topic])
    registry.consumer_group_bind_topics(name=a.consumer, topics=[a.topic])
    a_meta, b_meta = signed(grpc_server, a), signed(grpc_server, b, B_CLIENT)
    beat = rpc.HeartbeatRequest(client_type=pb.PRODUCER)
    assert stub.Heartbeat(beat, metadata=b_meta).status.code == pb.Code.OK  # B holds B_CLIENT

    def send(**change: Any) -> Any:
        request = rpc.SendMessageRequest(messages=[raw_message(b.topic, **change)])
        entry = stub.SendMessage(request, metadata=b_meta).entries[0]
        assert entry.status.code == pb.Code.OK, entry.status
        return entry

    prepared = send(body=b"b's half", system={"message_type": pb.TRANSACTION})
    due = Timestamp(seconds=int(time.time()) + 3600)
    delayed = send(body=b"b's later", system={"delivery_timestamp": due})
    send(body=b"b's now")
    receive = rpc.ReceiveMessageRequest(
        group=pb.Resource(name=b.consumer),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=b.topic), id=-1),
        invisible_duration=Duration(seconds=300),
    )
    got = [each for each in stub.ReceiveMessage(receive, metadata=b_meta) if each.message.body]
    assert [each.message.body for each in got] == [b"b's now"]
    return Tenants(
        a,
        b,
        a_meta,
        b_meta,
        prepared.transaction_id,
        delayed.recall_handle,
        delayed.message_id,
        got[0].message.system_properties.receipt_handle,
        got[0].message.system_properties.message_id,
    )


def receive_status(stub: MessagingServiceStub, meta: Any, group: str, topic: str) -> Any:
    request = rpc.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
    )
    return next(iter(stub.ReceiveMessage(request, metadata=meta))).status


def test_b_s_topics_and_groups_answer_a_as_names_that_do_not_exist(
    tenants: Tenants, stub: MessagingServiceStub, streams: list[Telemetry]
) -> None:
    t, meta = tenants, tenants.a_meta
    before = b_rows(t)

    def route(topic: str) -> Any:
        request = rpc.QueryRouteRequest(topic=pb.Resource(name=topic))
        return stub.QueryRoute(request, metadata=meta).status

    def beat(group: str) -> Any:
        request = rpc.HeartbeatRequest(
            client_type=pb.SIMPLE_CONSUMER, group=pb.Resource(name=group)
        )
        return stub.Heartbeat(request, metadata=meta).status

    def assignment(group: str, topic: str) -> Any:
        request = rpc.QueryAssignmentRequest(
            topic=pb.Resource(name=topic), group=pb.Resource(name=group)
        )
        return stub.QueryAssignment(request, metadata=meta).status

    def sent(topic: str) -> Any:
        request = rpc.SendMessageRequest(messages=[raw_message(topic, body=b"a's")])
        return stub.SendMessage(request, metadata=meta).status

    def subscribed(group: str) -> Any:
        stream = Telemetry(stub, signed_again(meta))
        streams.append(stream)
        subscription = pb.Subscription(
            group=pb.Resource(name=group),
            subscriptions=[pb.SubscriptionEntry(topic=pb.Resource(name=t.b.topic))],
        )
        stream.outgoing.put(
            rpc.TelemetryCommand(
                settings=pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=subscription)
            )
        )
        return stream.next().status

    # (B's name, a made-up name, the call): each refused, and alike.
    calls: list[tuple[str, str, Callable[[str], Any]]] = [
        (t.b.topic, NO_TOPIC, route),
        (t.b.consumer, NO_GROUP, beat),
        (t.b.consumer, NO_GROUP, lambda group: assignment(group, t.b.topic)),
        (t.b.topic, NO_TOPIC, lambda topic: assignment(t.a.consumer, topic)),
        (t.b.topic, NO_TOPIC, sent),
        (t.b.consumer, NO_GROUP, lambda group: receive_status(stub, meta, group, t.b.topic)),
        (t.b.topic, NO_TOPIC, lambda topic: receive_status(stub, meta, t.a.consumer, topic)),
        (t.b.consumer, NO_GROUP, subscribed),
        (t.b.consumer, NO_GROUP, lambda group: handled(stub, meta, t, group, "ack")),
        (t.b.consumer, NO_GROUP, lambda group: handled(stub, meta, t, group, "change")),
        (t.b.consumer, NO_GROUP, lambda group: handled(stub, meta, t, group, "dead letter")),
    ]
    for theirs_name, none_name, call in calls:
        theirs, none = call(theirs_name), call(none_name)
        assert theirs.code == pb.Code.FORBIDDEN, (theirs_name, theirs)
        assert said(theirs, theirs_name) == said(none, none_name)
    assert b_rows(t) == before
    assert not GrpcClient.objects.filter(token_id=t.a.token_id).exclude(group="").exists()
    # The positive control: B's own client uses each of them.
    b = t.b_meta
    assert (
        stub.QueryRoute(
            rpc.QueryRouteRequest(topic=pb.Resource(name=t.b.topic)), metadata=b
        ).status.code
        == pb.Code.OK
    )
    ours = rpc.QueryAssignmentRequest(
        topic=pb.Resource(name=t.b.topic), group=pb.Resource(name=t.b.consumer)
    )
    assert stub.QueryAssignment(ours, metadata=b).status.code == pb.Code.OK
    request = rpc.SendMessageRequest(messages=[raw_message(t.b.topic, body=b"b's")])
    assert stub.SendMessage(request, metadata=b).status.code == pb.Code.OK
    assert receive_status(stub, b, t.b.consumer, t.b.topic).code == pb.Code.OK
    consumer = rpc.HeartbeatRequest(
        client_type=pb.SIMPLE_CONSUMER, group=pb.Resource(name=t.b.consumer)
    )
    assert stub.Heartbeat(consumer, metadata=signed_again(b)).status.code == pb.Code.OK


def handled(stub: MessagingServiceStub, meta: Any, t: Tenants, group: str, call: str) -> Any:
    """The answer to an ack, a change of invisible time or a dead-lettering (`call`) of B's
    receipt handle in `group`."""
    named = {"group": pb.Resource(name=group), "topic": pb.Resource(name=t.b.topic)}
    handle, msg_id = t.receipt_handle, t.received_id
    ack = rpc.AckMessageRequest(
        **named, entries=[rpc.AckMessageEntry(message_id=msg_id, receipt_handle=handle)]
    )
    change = rpc.ChangeInvisibleDurationRequest(
        **named,
        receipt_handle=handle,
        invisible_duration=Duration(seconds=600),
        message_id=msg_id,
    )
    dead = rpc.ForwardMessageToDeadLetterQueueRequest(
        **named, receipt_handle=handle, message_id=msg_id, delivery_attempt=1
    )
    if call == "ack":
        return stub.AckMessage(ack, metadata=meta).status
    if call == "change":
        return stub.ChangeInvisibleDuration(change, metadata=meta).status
    return stub.ForwardMessageToDeadLetterQueue(dead, metadata=meta).status


def signed_again(meta: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The same signed metadata under a fresh client id of the same token (a stream each)."""
    fresh = f"a-host@{uuid.uuid4().hex[:8]}@0@consumer"
    return [(k, fresh if k == "x-mq-client-id" else v) for k, v in meta]


def test_b_s_handles_and_transaction_ids_answer_a_as_ones_that_do_not_exist(
    tenants: Tenants, stub: MessagingServiceStub
) -> None:
    t, meta = tenants, tenants.a_meta
    before = b_rows(t)
    made_up_handle = t.receipt_handle.split(".")[0] + "." + "0" * 24
    seconds = Duration(seconds=600)

    def ack(handle: str) -> Any:
        request = rpc.AckMessageRequest(
            group=pb.Resource(name=t.a.consumer),
            topic=pb.Resource(name=t.a.topic),
            entries=[rpc.AckMessageEntry(message_id=t.received_id, receipt_handle=handle)],
        )
        return stub.AckMessage(request, metadata=meta).status

    def change(handle: str) -> Any:
        request = rpc.ChangeInvisibleDurationRequest(
            group=pb.Resource(name=t.a.consumer),
            topic=pb.Resource(name=t.a.topic),
            receipt_handle=handle,
            invisible_duration=seconds,
            message_id=t.received_id,
        )
        return stub.ChangeInvisibleDuration(request, metadata=meta).status

    def dead_letter(handle: str, topic: str = t.a.topic) -> Any:
        request = rpc.ForwardMessageToDeadLetterQueueRequest(
            group=pb.Resource(name=t.a.consumer),
            topic=pb.Resource(name=topic),
            receipt_handle=handle,
            message_id=t.received_id,
            delivery_attempt=1,
            max_delivery_attempts=16,
        )
        return stub.ForwardMessageToDeadLetterQueue(request, metadata=meta).status

    def end(transaction_id: str, source: int) -> Any:
        request = rpc.EndTransactionRequest(
            topic=pb.Resource(name=t.a.topic),
            message_id=NO_MESSAGE,
            transaction_id=transaction_id,
            resolution=pb.COMMIT,
            source=source,
        )
        return stub.EndTransaction(request, metadata=meta).status

    def recall(handle: str) -> Any:
        request = rpc.RecallMessageRequest(topic=pb.Resource(name=t.b.topic), recall_handle=handle)
        return stub.RecallMessage(request, metadata=meta).status

    made_up_transaction = str(uuid.uuid4())
    made_up_recall = recall_handle_for(t.b.topic, NO_MESSAGE)
    # (B's, a made-up one, the call, B's names and the made-up names in the answers)
    calls: list[tuple[str, str, Callable[[str], Any], tuple[str, ...], tuple[str, ...]]] = [
        (t.receipt_handle, made_up_handle, ack, (), ()),
        (t.receipt_handle, made_up_handle, change, (), ()),
        (t.receipt_handle, made_up_handle, dead_letter, (), ()),
        (
            t.b.topic,
            NO_TOPIC,
            lambda topic: dead_letter(t.receipt_handle, topic),
            (t.b.topic,),
            (NO_TOPIC,),
        ),
        (
            t.transaction_id,
            made_up_transaction,
            lambda tid: end(tid, pb.SOURCE_CLIENT),
            (t.transaction_id,),
            (made_up_transaction,),
        ),
        (
            t.transaction_id,
            made_up_transaction,
            lambda tid: end(tid, pb.SOURCE_SERVER_CHECK),
            (t.transaction_id,),
            (made_up_transaction,),
        ),
        (t.recall_handle, made_up_recall, recall, (t.delayed_id,), (NO_MESSAGE,)),
    ]
    for theirs_arg, none_arg, call, theirs_names, none_names in calls:
        theirs, none = call(theirs_arg), call(none_arg)
        assert theirs.code not in (pb.Code.OK, pb.Code.MULTIPLE_RESULTS), (theirs_arg, theirs)
        assert said(theirs, *theirs_names) == said(none, *none_names), (theirs_arg, theirs, none)
    assert b_rows(t) == before
    # The positive control: B's handle, transaction and recall handle still work for B.
    b = t.b_meta
    mine = rpc.AckMessageRequest(
        group=pb.Resource(name=t.b.consumer),
        topic=pb.Resource(name=t.b.topic),
        entries=[rpc.AckMessageEntry(message_id=t.received_id, receipt_handle=t.receipt_handle)],
    )
    assert stub.AckMessage(mine, metadata=b).status.code == pb.Code.OK
    commit = rpc.EndTransactionRequest(
        topic=pb.Resource(name=t.b.topic),
        transaction_id=t.transaction_id,
        resolution=pb.COMMIT,
        source=pb.SOURCE_CLIENT,
    )
    assert stub.EndTransaction(commit, metadata=b).status.code == pb.Code.OK
    again = rpc.RecallMessageRequest(
        topic=pb.Resource(name=t.b.topic), recall_handle=t.recall_handle
    )
    assert stub.RecallMessage(again, metadata=b).status.code == pb.Code.OK
    assert HalfMessage.objects.get(transaction_id=t.transaction_id).state == "COMMITTED"
    assert RecalledMessage.objects.filter(msg_id=t.delayed_id).exists()


def test_a_client_id_b_holds_is_a_client_of_a_s_and_b_s_stays_as_it_was(
    tenants: Tenants, grpc_server: GrpcServer, stub: MessagingServiceStub
) -> None:
    # The rule changed with decision 0100: A's calls under B's id were refused FORBIDDEN (which
    # told A the id was in use); they are now answered as for an id no one uses, as A's client.
    t = tenants
    stolen = signed(grpc_server, t.a, B_CLIENT)
    fresh = signed(grpc_server, t.a, "a-fresh-host@1@0@producer")
    before = b_rows(t)
    beat = rpc.HeartbeatRequest(client_type=pb.PRODUCER)
    goodbye = rpc.NotifyClientTerminationRequest()
    beats = [stub.Heartbeat(beat, metadata=meta).status for meta in (stolen, fresh)]
    assert GrpcClient.objects.get(client_id=B_CLIENT, token_id=t.a.token_id).group == t.a.producer
    byes = [stub.NotifyClientTermination(goodbye, metadata=meta).status for meta in (stolen, fresh)]
    answers = [[beat_answer, bye] for beat_answer, bye in zip(beats, byes, strict=True)]
    assert answers[0] == answers[1], answers
    assert [answer.code for answer in answers[0]] == [pb.Code.OK, pb.Code.OK]
    # A's goodbye deleted A's client under that id (decision 0101), and nothing of B's.
    assert not GrpcClient.objects.filter(client_id=B_CLIENT, token_id=t.a.token_id).exists()
    assert b_rows(t) == before
    # The positive control: B's client id is still B's, and B may use it.
    assert stub.Heartbeat(beat, metadata=t.b_meta).status.code == pb.Code.OK
    row = GrpcClient.objects.get(client_id=B_CLIENT, token_id=t.b.token_id)
    assert row.group == t.b.producer
