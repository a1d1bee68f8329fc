"""A RocketMQ client's own message ids are scoped per producer group (decision 0040), through the
real gRPC server with raw stubs: one tenant cannot squat another's ids, and no answer says that
another group used an id."""

import uuid
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import CommitLogEntry, HalfMessage
from apps.broker.services import registry
from tests.grpc.conftest import GrpcServer, Setup
from tests.support.grpc import signed

pytestmark = pytest.mark.e2e


def send(stub: Any, meta: Any, topic: str, client_id: str, body: bytes, kind: int) -> Any:
    request = rpc.SendMessageRequest(
        messages=[
            pb.Message(
                topic=pb.Resource(name=topic),
                body=body,
                system_properties=pb.SystemProperties(message_id=client_id, message_type=kind),
            )
        ]
    )
    answer = stub.SendMessage(request, metadata=meta)
    return answer.status, answer.entries[0]


def tenant(grpc_server: GrpcServer, make: Callable[..., Setup], suffix: str) -> tuple[str, Any]:
    setup = make(suffix)
    token = registry.token_create(name=f"tenant{suffix}", scopes=[f"produce:{setup.producer}"])
    return setup.topic, signed(grpc_server, token[0])


@pytest.mark.parametrize("kind", [pb.NORMAL, pb.TRANSACTION])
def test_another_groups_message_id_is_not_squatted_and_retries_stay_idempotent(
    grpc_server: GrpcServer, rocketmq_setup: Callable[..., Setup], kind: int
) -> None:
    model = HalfMessage if kind == pb.TRANSACTION else CommitLogEntry
    victim_topic, victim = tenant(grpc_server, rocketmq_setup, "-victim")
    squatter_topic, squatter = tenant(grpc_server, rocketmq_setup, "-squatter")
    client_id = "01" + uuid.uuid4().hex.upper()
    with grpc.insecure_channel(grpc_server.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        status, first = send(stub, squatter, squatter_topic, client_id, b"squat", kind)
        assert status.code == pb.OK, status
        assert first.message_id == client_id  # the positive control: a free id is kept as sent
        answers = [
            send(stub, victim, victim_topic, client_id, b"order 9527 created", kind)
            for _retry in range(2)
        ]
        for status, entry in answers:
            # The victim's send is stored, under an id of its own group, and nothing in the
            # answer speaks of the other group.
            assert status.code == pb.OK, status
            assert entry.message_id not in ("", client_id)
            assert "use" not in status.message
        assert answers[0][1].message_id == answers[1][1].message_id  # the retry found it
        again = send(stub, squatter, squatter_topic, client_id, b"squat", kind)[1]
        assert again.message_id == client_id  # the squatter's own retry: its own message
    victims = model.objects.filter(body=b"order 9527 created")
    assert list(victims.values_list("msg_id", flat=True)) == [answers[0][1].message_id]
    assert model.objects.filter(msg_id=client_id).count() == 1
    assert model.objects.get(msg_id=client_id).body == b"squat"


@pytest.mark.parametrize("kind", [pb.NORMAL, pb.TRANSACTION])
def test_the_same_id_on_another_topic_of_the_group_is_still_a_conflict(
    grpc_server: GrpcServer, rocketmq_setup: Callable[..., Setup], kind: int
) -> None:
    """A prepare's retry is answered with the earlier half only on its own topic (decision 0111):
    on another topic the id is the group's other message's."""
    model = HalfMessage if kind == pb.TRANSACTION else CommitLogEntry
    topic, meta = tenant(grpc_server, rocketmq_setup, "-own")
    registry.topic_create(name="orders-own-2", queues=4)
    client_id = "01" + uuid.uuid4().hex.upper()
    with grpc.insecure_channel(grpc_server.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        assert send(stub, meta, topic, client_id, b"a", kind)[0].code == pb.OK
        status, _ = send(stub, meta, "orders-own-2", client_id, b"a", kind)
    assert status.code != pb.OK
    assert model.objects.filter(msg_id=client_id).count() == 1


def test_the_id_of_a_committed_transaction_is_not_answered_as_a_send(
    grpc_server: GrpcServer, rocketmq_setup: Callable[..., Setup]
) -> None:
    """A normal send under the id of the group's own committed transaction is a conflict
    (decision 0040): the message under it is the transaction's, not a first try of this send."""
    topic, meta = tenant(grpc_server, rocketmq_setup, "-committed")
    client_id = "01" + uuid.uuid4().hex.upper()
    with grpc.insecure_channel(grpc_server.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        status, entry = send(stub, meta, topic, client_id, b"a", pb.TRANSACTION)
        assert status.code == pb.OK, status
        end = rpc.EndTransactionRequest(
            topic=pb.Resource(name=topic),
            message_id=client_id,
            transaction_id=entry.transaction_id,
            resolution=pb.COMMIT,
            source=pb.SOURCE_CLIENT,
        )
        assert stub.EndTransaction(end, metadata=meta).status.code == pb.OK
        [committed] = CommitLogEntry.objects.filter(msg_id=client_id)
        assert committed.transaction_id is not None
        status, _ = send(stub, meta, topic, client_id, b"a", pb.NORMAL)
        assert status.code != pb.OK
        assert "transaction" in status.message
        # Positive control: a normal send's retry under its own id answers what it stored.
        other_id = "01" + uuid.uuid4().hex.upper()
        first = send(stub, meta, topic, other_id, b"b", pb.NORMAL)
        again = send(stub, meta, topic, other_id, b"b", pb.NORMAL)
        assert (first[0].code, again[0].code) == (pb.OK, pb.OK)
        assert again[1].offset == first[1].offset
    assert CommitLogEntry.objects.filter(msg_id=client_id).count() == 1
    assert CommitLogEntry.objects.filter(msg_id=other_id).count() == 1


def test_two_other_groups_under_one_held_id_each_get_an_id_of_their_own(
    grpc_server: GrpcServer, rocketmq_setup: Callable[..., Setup]
) -> None:
    """The scoped id is derived from the group as well as the client's id (decision 0040): two
    groups whose client id a third holds are stored under two ids, and neither is refused."""
    holder_topic, holder = tenant(grpc_server, rocketmq_setup, "-holder")
    first_topic, first = tenant(grpc_server, rocketmq_setup, "-first")
    second_topic, second = tenant(grpc_server, rocketmq_setup, "-second")
    client_id = "01" + uuid.uuid4().hex.upper()
    with grpc.insecure_channel(grpc_server.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        assert send(stub, holder, holder_topic, client_id, b"h", pb.NORMAL)[0].code == pb.OK
        answers = [
            send(stub, first, first_topic, client_id, b"one", pb.NORMAL),
            send(stub, second, second_topic, client_id, b"two", pb.NORMAL),
        ]
    assert [status.code for status, _ in answers] == [pb.OK, pb.OK]
    ids = [entry.message_id for _, entry in answers]
    assert len({client_id, *ids}) == 3
    stored = dict(CommitLogEntry.objects.filter(msg_id__in=ids).values_list("msg_id", "body"))
    assert stored == {ids[0]: b"one", ids[1]: b"two"}
