"""Hostile input at the gRPC door (CONTRACT section 3, invariant 9), with raw stubs against the
real server: every refused message gets the protocol's own code and stores nothing, a token
without the scope is FORBIDDEN, and a producer's token has exactly one `produce:` scope. Each
table row has a positive control: the same message with the hostile part made good is stored."""

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from apps.broker.models import CommitLogEntry, HalfMessage
from apps.broker.services import registry
from tests.grpc.conftest import GrpcServer
from tests.support.grpc import raw_message, signed

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024


def far_future() -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(datetime.now(UTC) + timedelta(days=400))
    return stamp


# (what, the hostile change, the code, the same message made good)
HOSTILE: list[tuple[str, dict[str, Any], int, dict[str, Any]]] = [
    ("empty body", {"body": b""}, pb.MESSAGE_BODY_EMPTY, {"body": b"x"}),
    ("a tag with a bar", {"system": {"tag": "a|b"}}, pb.ILLEGAL_MESSAGE_TAG,
     {"system": {"tag": "a"}}),
    ("NUL in a tag", {"system": {"tag": "a\x00b"}}, pb.ILLEGAL_MESSAGE_TAG,
     {"system": {"tag": "ab"}}),
    ("a blank tag", {"system": {"tag": "  "}}, pb.ILLEGAL_MESSAGE_TAG, {"system": {"tag": "t"}}),
    ("a 129-character tag", {"system": {"tag": "t" * 129}}, pb.ILLEGAL_MESSAGE_TAG,
     {"system": {"tag": "t" * 128}}),
    ("NUL in a key", {"system": {"keys": ["k\x00"]}}, pb.ILLEGAL_MESSAGE_KEY,
     {"system": {"keys": ["k"]}}),
    ("NUL in a property", {"properties": {"p": "v\x00"}}, pb.ILLEGAL_MESSAGE_PROPERTY_KEY,
     {"properties": {"p": "v"}}),
    ("129 properties", {"properties": {f"p{i}": "v" for i in range(129)}},
     pb.MESSAGE_PROPERTIES_TOO_LARGE, {"properties": {f"p{i}": "v" for i in range(128)}}),
    ("properties over 16 KiB", {"properties": {"big": "v" * 16385}},
     pb.MESSAGE_PROPERTIES_TOO_LARGE, {"properties": {"big": "v" * 16000}}),
    ("a message id with a dash", {"system": {"message_id": "a-b"}}, pb.ILLEGAL_MESSAGE_ID,
     {"system": {"message_id": "AB"}}),
    ("a 65-character message id", {"system": {"message_id": "A" * 65}}, pb.ILLEGAL_MESSAGE_ID,
     {"system": {"message_id": "A" * 64}}),
    ("NUL in the topic", {"topic": "orders\x00"}, pb.ILLEGAL_TOPIC, {}),
    ("a 128-character topic", {"topic": "t" * 128}, pb.ILLEGAL_TOPIC, {}),
    ("a delivery time 400 days ahead", {"system": {"delivery_timestamp": far_future()}},
     pb.ILLEGAL_DELIVERY_TIME, {}),
    ("a message type of 999", {"system": {"message_type": 999}}, pb.BAD_REQUEST, {}),
    ("a body encoding of 999", {"system": {"body_encoding": 999}}, pb.BAD_REQUEST,
     {"system": {"body_encoding": pb.IDENTITY}}),
    ("a PRIORITY message", {"system": {"message_type": pb.PRIORITY}}, pb.UNSUPPORTED, {}),
    ("a LITE message", {"system": {"message_type": pb.LITE}}, pb.UNSUPPORTED, {}),
    ("a body of 4 MiB + 1", {"body": b"x" * (4 * MiB + 1)}, pb.MESSAGE_BODY_TOO_LARGE,
     {"body": b"x" * (4 * MiB)}),
]  # fmt: skip


def stored() -> tuple[int, int]:
    return HalfMessage.objects.count(), CommitLogEntry.objects.count()


@pytest.mark.parametrize(
    ("change", "code", "good"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE]
)
def test_a_hostile_message_gets_its_code_and_stores_nothing(
    door: Any, change: dict[str, Any], code: int, good: dict[str, Any]
) -> None:
    setup, stub, meta = door
    before = stored()
    answer = stub.SendMessage(
        rpc.SendMessageRequest(messages=[raw_message(setup.topic, **change)]), metadata=meta
    )
    assert (answer.status.code, answer.entries[0].status.code) == (code, code), answer.status
    assert stored() == before
    control = stub.SendMessage(
        rpc.SendMessageRequest(messages=[raw_message(setup.topic, **good)]), metadata=meta
    )
    assert control.status.code == pb.OK, control.status
    assert stored() == (before[0], before[1] + 1)


def test_more_than_64_messages_in_one_request_are_refused_whole(door: Any) -> None:
    setup, stub, meta = door
    before = stored()
    answer = stub.SendMessage(
        rpc.SendMessageRequest(messages=[raw_message(setup.topic) for _ in range(65)]),
        metadata=meta,
    )
    assert answer.status.code == pb.BAD_REQUEST, answer.status
    assert stored() == before
    # Positive control at the bound (decision 0107): 64 messages are one request.
    answer = stub.SendMessage(
        rpc.SendMessageRequest(messages=[raw_message(setup.topic) for _ in range(64)]),
        metadata=meta,
    )
    assert answer.status.code == pb.OK, answer.status
    assert stored() == (before[0], before[1] + 64)


def test_a_producer_token_needs_exactly_one_produce_scope(
    grpc_server: GrpcServer, door: Any
) -> None:
    setup, stub, _ = door
    registry.producer_group_create(name="second-shop")
    scopes = {
        "no produce scope": [f"consume:{setup.consumer}"],
        "two produce scopes": [f"produce:{setup.producer}", "produce:second-shop"],
    }
    before = stored()
    for what, token_scopes in scopes.items():
        token = registry.token_create(name=what, scopes=token_scopes)[0]
        answer = stub.SendMessage(
            rpc.SendMessageRequest(messages=[raw_message(setup.topic)]),
            metadata=signed(grpc_server, token),
        )
        assert answer.status.code == pb.FORBIDDEN, (what, answer.status)
        assert "exactly one 'produce:<group>' scope" in answer.status.message
    assert stored() == before


def test_a_consumer_without_the_groups_scope_is_forbidden(
    grpc_server: GrpcServer, door: Any
) -> None:
    setup, stub, producer_meta = door
    sent = stub.SendMessage(
        rpc.SendMessageRequest(messages=[raw_message(setup.topic)]), metadata=producer_meta
    )
    assert sent.status.code == pb.OK
    receive = rpc.ReceiveMessageRequest(
        group=pb.Resource(name=setup.consumer),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=setup.topic), id=-1),
        batch_size=32,
    )
    registry.consumer_group_create(
        name="other-billing", max_delivery_attempts=16, consume_from="first"
    )
    other = registry.token_create(name="other", scopes=["consume:other-billing"])[0]
    [refused] = list(stub.ReceiveMessage(receive, metadata=signed(grpc_server, other)))
    assert refused.status.code == pb.FORBIDDEN, refused.status
    # The positive control: the group's own consumer receives the message.
    own = registry.token_create(name="own", scopes=[f"consume:{setup.consumer}"])[0]
    answers = list(stub.ReceiveMessage(receive, metadata=signed(grpc_server, own)))
    bodies = [a.message.body for a in answers if a.HasField("message")]
    assert bodies == [b"order 9527 created"], answers


def test_ending_another_groups_transaction_says_nothing_of_it(
    grpc_server: GrpcServer, door: Any
) -> None:
    setup, stub, meta = door
    answer = stub.SendMessage(
        rpc.SendMessageRequest(
            messages=[raw_message(setup.topic, system={"message_type": pb.TRANSACTION})]
        ),
        metadata=meta,
    )
    assert answer.status.code == pb.OK, answer.status
    entry = answer.entries[0]
    registry.producer_group_create(name="intruder")
    intruder = registry.token_create(name="intruder", scopes=["produce:intruder"])[0]
    end = rpc.EndTransactionRequest(
        topic=pb.Resource(name=setup.topic),
        message_id=entry.message_id,
        transaction_id=entry.transaction_id,
        resolution=pb.COMMIT,
        source=pb.SOURCE_CLIENT,
    )
    refused = stub.EndTransaction(end, metadata=signed(grpc_server, intruder))
    unknown = stub.EndTransaction(
        rpc.EndTransactionRequest(
            topic=pb.Resource(name=setup.topic),
            message_id=entry.message_id,
            transaction_id=str(uuid.uuid4()),
            resolution=pb.COMMIT,
            source=pb.SOURCE_CLIENT,
        ),
        metadata=signed(grpc_server, intruder),
    )
    # Another group's transaction is answered exactly as one that does not exist.
    assert refused.status.code == unknown.status.code == pb.INVALID_TRANSACTION_ID
    assert HalfMessage.objects.get(msg_id=entry.message_id).state == "PREPARED"
    committed = stub.EndTransaction(end, metadata=meta)  # the positive control
    assert committed.status.code == pb.OK, committed.status
    assert HalfMessage.objects.get(msg_id=entry.message_id).state == "COMMITTED"
