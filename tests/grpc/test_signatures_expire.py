"""A signed gRPC call is accepted only while its x-mq-date-time is within 15 minutes of the
server's clock, either way (issue 24, item 5; docs/decisions/0035), as RocketMQ's proxy checks
it: a captured signature cannot be replayed later."""

from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.util.signature import Signature

from apps.broker.services import credentials, registry
from tests.grpc.conftest import GrpcServer

pytestmark = pytest.mark.e2e


def signed_at(keys: dict[str, str], moment: datetime) -> list[tuple[str, str]]:
    date_time = moment.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    signature = Signature.sign(keys["secret_key"], date_time)
    authorization = (
        f"MQv2-HMAC-SHA1 Credential={keys['access_key']}, SignedHeaders=x-mq-date-time, "
        f"Signature={signature}"
    )
    return [
        ("x-mq-date-time", date_time),
        ("x-mq-client-id", "signature-test"),
        ("authorization", authorization),
    ]


@pytest.mark.parametrize(
    ("minutes", "code"),
    [(-20, pb.UNAUTHORIZED), (20, pb.UNAUTHORIZED), (-14, pb.OK), (14, pb.OK), (0, pb.OK)],
)
def test_a_signature_older_or_newer_than_15_minutes_is_unauthorized(
    grpc_server: GrpcServer, transactional_db: None, minutes: int, code: int
) -> None:
    registry.topic_create(name="signed", queues=1)
    token = registry.token_create(name="signer", scopes=["admin"])[0]
    meta = signed_at(credentials.of(token), datetime.now(UTC) + timedelta(minutes=minutes))
    with grpc.insecure_channel(grpc_server.endpoint) as channel:
        answer: Any = MessagingServiceStub(channel).QueryRoute(
            rpc.QueryRouteRequest(topic=pb.Resource(name="signed")), metadata=meta
        )
    assert answer.status.code == code, answer.status
    if code == pb.UNAUTHORIZED:
        assert "clock" in answer.status.message


def test_a_date_time_that_is_not_one_is_unauthorized(
    grpc_server: GrpcServer, transactional_db: None
) -> None:
    token = registry.token_create(name="signer", scopes=["admin"])[0]
    keys = credentials.of(token)
    meta = [
        (name, value)
        for name, value in signed_at(keys, datetime.now(UTC))
        if name not in ("x-mq-date-time", "authorization")
    ]
    date_time = "not a time"
    signature = Signature.sign(keys["secret_key"], date_time)
    meta += [
        ("x-mq-date-time", date_time),
        (
            "authorization",
            f"MQv2-HMAC-SHA1 Credential={keys['access_key']}, SignedHeaders=x-mq-date-time, "
            f"Signature={signature}",
        ),
    ]
    with grpc.insecure_channel(grpc_server.endpoint) as channel:
        answer: Any = MessagingServiceStub(channel).QueryRoute(
            rpc.QueryRouteRequest(topic=pb.Resource(name="signed")), metadata=meta
        )
    assert answer.status.code == pb.UNAUTHORIZED, answer.status
