"""A deleted consumer group leaves no access behind at the gRPC door (docs/decisions/0088): the
server process kept the token under the configuration epoch (decision 0026), yet once the group
is deleted and one of the same name made again (another tenant's), the old token's receive of it
is refused FORBIDDEN instead of taking the new group's messages. The token's other scopes stay,
and so does another group's token (the positive control)."""

from typing import Any

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import ApiToken, Topic
from apps.broker.services import registry, sending
from apps.broker.services.sending import OutgoingMessage
from tests.grpc.conftest import GrpcServer
from tests.support.grpc import WAIT, signed

pytestmark = pytest.mark.e2e


def send_one(setup: Any) -> None:
    sending.message_send_batch(
        topic=Topic.objects.get(name=setup.topic),
        messages=[(OutgoingMessage(setup.producer, b"order", body_is_binary=False), None)],
    )


def test_a_token_of_a_deleted_group_cannot_receive_from_a_new_group_of_its_name(
    grpc_server: GrpcServer, rocketmq_setup: Any, stub: MessagingServiceStub
) -> None:
    old, control = rocketmq_setup("-old"), rocketmq_setup("-control")

    def receive(setup: Any) -> list[Any]:
        request = rpc.ReceiveMessageRequest(
            group=pb.Resource(name=setup.consumer),
            message_queue=pb.MessageQueue(topic=pb.Resource(name=setup.topic), id=-1),
            long_polling_timeout={"seconds": 0},
        )
        meta = signed(grpc_server, setup, f"host-{setup.topic}@1@0@consumer")
        return list(stub.ReceiveMessage(request, metadata=meta, timeout=WAIT))

    def messages(answers: list[Any]) -> list[bytes]:
        return [a.message.body for a in answers if a.WhichOneof("content") == "message"]

    send_one(old)
    assert messages(receive(old)) == [b"order"]  # the server keeps the token from here on

    registry.consumer_group_delete(name=old.consumer)
    registry.consumer_group_create(
        name=old.consumer, max_delivery_attempts=16, consume_from="first"
    )
    send_one(old)
    send_one(control)

    refused = receive(old)
    assert messages(refused) == []
    assert refused[-1].status.code == pb.Code.FORBIDDEN, refused[-1].status
    assert messages(receive(control)) == [b"order"]
    assert ApiToken.objects.get(pk=old.token_id).scopes == [f"produce:{old.producer}"]
