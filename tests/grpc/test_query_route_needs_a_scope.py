"""QueryRoute reveals a topic's queues only to a token whose scopes cover the topic (issue 24,
item 15): admin, or a produce/consume scope of a group that may use it (an unbound group may use
any topic, a bound one only its topics: docs/decisions/0010)."""

from typing import Any

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.util.signature import Signature

from apps.broker.services import credentials, registry
from tests.grpc.conftest import GrpcServer

pytestmark = pytest.mark.e2e


def route(server: GrpcServer, scopes: list[str], topic: str) -> Any:
    token = registry.token_create(name="route", scopes=scopes)[0]
    keys = credentials.of(token)
    config = ClientConfiguration(
        server.endpoint, Credentials(keys["access_key"], keys["secret_key"])
    )
    with grpc.insecure_channel(server.endpoint) as channel:
        return MessagingServiceStub(channel).QueryRoute(
            rpc.QueryRouteRequest(topic=pb.Resource(name=topic)),
            metadata=Signature.metadata(config, "route-client"),
        )


def test_query_route_needs_a_scope_or_binding_covering_the_topic(
    grpc_server: GrpcServer, transactional_db: None
) -> None:
    for name in ("payments", "orders"):
        registry.topic_create(name=name, queues=2)
    registry.consumer_group_create(name="ledger", max_delivery_attempts=16, consume_from="first")
    registry.consumer_group_bind_topics(name="ledger", topics=["payments"])
    registry.producer_group_create(name="shop")
    registry.producer_group_bind_topics(name="shop", topics=["orders"])
    registry.producer_group_create(name="free")  # bound to nothing: any topic

    refused = route(grpc_server, ["consume:ledger", "produce:shop"], "secret-topic")
    assert refused.status.code == pb.FORBIDDEN, refused.status
    assert list(refused.message_queues) == []
    assert route(grpc_server, ["consume:ledger"], "orders").status.code == pb.FORBIDDEN
    # The positive controls: a binding, another scope's binding, an unbound group, admin.
    for scopes, topic in [
        (["consume:ledger"], "payments"),
        (["consume:ledger", "produce:shop"], "orders"),
        (["produce:free"], "payments"),
        (["admin"], "orders"),
    ]:
        answer = route(grpc_server, scopes, topic)
        assert answer.status.code == pb.OK, (scopes, topic, answer.status)
        assert len(answer.message_queues) == 2
