"""The per-token rate limit (TXHUB_THROTTLE_RATE) over gRPC: the REST API's budget and counter in
the shared Redis, answered with the protocol's TOO_MANY_REQUESTS."""

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from rest_framework.test import APIClient
from rocketmq import ClientConfiguration, Credentials
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.util.signature import Signature

from apps.broker.services import credentials, registry
from tests.grpc.conftest import start_grpc, stop
from tests.support import workers
from tests.support.grpc import Telemetry
from tests.support.ports import free_port
from tests.support.throttling import fresh_budget

pytestmark = pytest.mark.e2e

RATE, WINDOW = 5, 3600  # "5/h": a burst of a second never straddles two windows in practice


@pytest.fixture(scope="module")
def throttled_endpoint(django_db_setup: None) -> Iterator[str]:
    port = free_port()
    with open(workers.log_path("test-grpc-throttled.log"), "w") as log:
        process = start_grpc(port, log, {"TXHUB_THROTTLE_RATE": f"{RATE}/h"})
        yield f"127.0.0.1:{port}"
        stop(process)


def test_over_the_rate_grpc_calls_get_too_many_requests_and_share_the_rest_budget(
    throttled_endpoint: str, transactional_db: None, settings: Any
) -> None:
    settings.TXHUB_THROTTLE_RATE = f"{RATE}/h"  # this process's REST door: the same rate
    registry.topic_create(name="limited", queues=1)
    registry.consumer_group_create(name="limited-c", max_delivery_attempts=16, consume_from="first")
    token, raw = registry.token_create(name="limited", scopes=["consume:limited-c"])
    fresh_budget(token.pk, WINDOW)
    keys = credentials.of(token)
    meta = Signature.metadata(
        ClientConfiguration(
            throttled_endpoint, Credentials(keys["access_key"], keys["secret_key"])
        ),
        "throttled-client",
    )
    route = rpc.QueryRouteRequest(topic=pb.Resource(name="limited"))
    with grpc.insecure_channel(throttled_endpoint) as channel:
        stub = MessagingServiceStub(channel)
        answers = [stub.QueryRoute(route, metadata=meta) for _ in range(RATE + 1)]
        receive = rpc.ReceiveMessageRequest(
            group=pb.Resource(name="limited-c"),
            message_queue=pb.MessageQueue(topic=pb.Resource(name="limited"), id=-1),
        )
        [received] = list(stub.ReceiveMessage(receive, metadata=meta))
    assert [a.status.code for a in answers[:RATE]] == [pb.Code.OK] * RATE, answers[0].status
    over = answers[RATE].status
    assert over.code == pb.Code.TOO_MANY_REQUESTS, over
    assert "retry in" in over.message
    assert received.status.code == pb.Code.TOO_MANY_REQUESTS, received.status
    # One budget per token whichever door: REST is refused too.
    rest = APIClient()
    rest.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    answer = rest.get("/api/v1/consumer-groups/limited-c")
    assert answer.status_code == 429, answer.content
    assert answer.json()["error"]["code"] == "throttled"


def test_telemetry_settings_commands_count_against_the_rate(
    throttled_endpoint: str, transactional_db: None
) -> None:
    registry.topic_create(name="chatty", queues=1)
    registry.producer_group_create(name="chatty-p")
    token, _ = registry.token_create(name="chatty", scopes=["produce:chatty-p"])
    fresh_budget(token.pk, WINDOW)
    keys = credentials.of(token)
    meta = Signature.metadata(
        ClientConfiguration(
            throttled_endpoint, Credentials(keys["access_key"], keys["secret_key"])
        ),
        "chatty-host@1@0@producer",
    )
    with grpc.insecure_channel(throttled_endpoint) as channel:
        stream = Telemetry(MessagingServiceStub(channel), meta)
        try:
            # Opening the stream is one call; each settings command is one more.
            answers = [stream.settings("chatty").status.code for _ in range(RATE)]
        finally:
            stream.close()
    assert answers == [pb.Code.OK] * (RATE - 1) + [pb.Code.TOO_MANY_REQUESTS], answers
