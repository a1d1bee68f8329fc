"""A producer group over its storage quota (docs/decisions/0085) at the gRPC door: SendMessage,
normal or transactional, answers FORBIDDEN and stores nothing, while another group's token keeps
sending; the check is the services' own, so the gRPC server needs no setting of its own."""

import time
from typing import Any

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from apps.broker import storage_quota
from apps.broker.services import registry
from tests.grpc.conftest import GrpcServer
from tests.support.grpc import raw_message, signed
from tests.support.storage import measured, no_quota_published, stored_rows

__all__ = ["no_quota_published"]

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("no_quota_published")]


def test_a_group_over_its_quota_is_forbidden_at_the_grpc_door(
    grpc_server: GrpcServer, door: Any, settings: Any
) -> None:
    setup, stub, meta = door
    settings.TXHUB_PRODUCER_GROUP_STORAGE_QUOTA = 10_000
    body = b"x" * 4000
    sent = [
        stub.SendMessage(
            rpc.SendMessageRequest(messages=[raw_message(setup.topic, body=body)]), metadata=meta
        )
        for _ in range(3)
    ]
    assert [answer.status.code for answer in sent] == [pb.Code.OK] * 3, sent[0].status
    assert setup.producer in measured()
    time.sleep(storage_quota.REFRESH_SECONDS + 0.2)  # the server reads the list again
    before = stored_rows()

    normal = raw_message(setup.topic, body=body)
    prepared = raw_message(setup.topic, body=body, system={"message_type": pb.TRANSACTION})
    for item in (normal, prepared):
        answer = stub.SendMessage(rpc.SendMessageRequest(messages=[item]), metadata=meta)
        assert answer.status.code == pb.Code.FORBIDDEN, answer.status
        assert "storage quota" in answer.status.message
        assert [entry.status.code for entry in answer.entries] == [pb.Code.FORBIDDEN]
    assert stored_rows() == before

    registry.producer_group_create(name="other-shop")
    other, _ = registry.token_create(name="other", scopes=["produce:other-shop"])
    answer = stub.SendMessage(
        rpc.SendMessageRequest(messages=[raw_message(setup.topic, body=body)]),
        metadata=signed(grpc_server, other),
    )
    assert answer.status.code == pb.Code.OK, answer.status
