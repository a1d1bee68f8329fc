"""Deleting a consumer group answers its waiting receives at once, as a receive of a group that
never existed is answered (docs/decisions/0088): REST 404 `not_found`, gRPC
CONSUMER_GROUP_NOT_FOUND; not at the end of their wait. Later receives of the group's tokens are
refused as tokens without its scope, which went with it. Over the real gRPC server and the real
ASGI gunicorn, whose processes also kept the group in their caches (decision 0026). The deletion
is the service DELETE /api/v1/consumer-groups/{group} runs; it reaches the waits through
Postgres NOTIFY on the wake-up hubs' channel."""

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import ConsumerCursor
from apps.broker.services import registry
from tests.conftest import Server
from tests.grpc.conftest import GrpcServer
from tests.support.grpc import WAIT, signed
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

LONG_POLL = 20  # seconds each receive asks to wait: an answer well before it was not a timeout
ANSWERED_WITHIN = 5  # seconds after the deletion (the fallback check alone takes 1 s)


def waiting(topic: str, group: str) -> bool:
    """A receive of the group has made its first try (it created the group's cursors): from here
    on it waits, or is about to."""
    return ConsumerCursor.objects.filter(topic__name=topic, group__name=group).exists()


def test_deleting_a_group_ends_its_grpc_long_poll_and_later_receives_are_refused(
    grpc_server: GrpcServer, rocketmq_setup: Any, stub: MessagingServiceStub
) -> None:
    doomed, spared = rocketmq_setup("-doomed"), rocketmq_setup("-spared")

    def receive(setup: Any, seconds: int) -> list[Any]:
        request = rpc.ReceiveMessageRequest(
            group=pb.Resource(name=setup.consumer),
            message_queue=pb.MessageQueue(topic=pb.Resource(name=setup.topic), id=-1),
            long_polling_timeout={"seconds": seconds},
        )
        meta = signed(grpc_server, setup, f"host-{setup.topic}@1@0@consumer")
        return list(stub.ReceiveMessage(request, metadata=meta, timeout=LONG_POLL + WAIT))

    with ThreadPoolExecutor(2) as pool:
        doomed_poll = pool.submit(receive, doomed, LONG_POLL)
        spared_poll = pool.submit(receive, spared, 3)
        assert wait_until(lambda: waiting(doomed.topic, doomed.consumer), timeout=WAIT)
        assert wait_until(lambda: waiting(spared.topic, spared.consumer), timeout=WAIT)
        assert not doomed_poll.done()
        registry.consumer_group_delete(name=doomed.consumer)
        deleted_at = time.monotonic()
        [answer] = doomed_poll.result(timeout=LONG_POLL + WAIT)
        answered_after = time.monotonic() - deleted_at
        [spared_answer] = spared_poll.result(timeout=LONG_POLL + WAIT)
    assert answer.status.code == pb.Code.CONSUMER_GROUP_NOT_FOUND, answer.status
    assert answered_after < ANSWERED_WITHIN, f"answered {answered_after:.1f} s after"
    # Positive control: another group's wait ran its course (nothing to receive).
    assert spared_answer.status.code == pb.Code.MESSAGE_NOT_FOUND, spared_answer.status
    # A receive after the deletion, through the server's cached token: its scope went with the
    # group (decision 0088), so the group's name is no longer the token's to use.
    [later] = receive(doomed, 0)
    assert later.status.code == pb.Code.FORBIDDEN, later.status


def test_deleting_a_group_ends_its_rest_long_poll_with_404(server: Server) -> None:
    registry.topic_create(name="deleted-rest", queues=1)
    registry.consumer_group_create(
        name="deleted-rest-c", max_delivery_attempts=16, consume_from="first"
    )
    _, raw = registry.token_create(name="consumer", scopes=["consume:deleted-rest-c"])
    url = server.url("/api/v1/consumer-groups/deleted-rest-c/receive")
    headers = {"Authorization": f"Bearer {raw}"}

    def receive(seconds: int) -> requests.Response:
        body = {"topic": "deleted-rest", "wait_seconds": seconds}
        return requests.post(url, json=body, headers=headers, timeout=LONG_POLL + WAIT)

    with ThreadPoolExecutor(1) as pool:
        poll = pool.submit(receive, LONG_POLL)  # its process keeps the group from here on
        assert wait_until(lambda: waiting("deleted-rest", "deleted-rest-c"), timeout=WAIT)
        assert not poll.done()
        registry.consumer_group_delete(name="deleted-rest-c")
        deleted_at = time.monotonic()
        answer = poll.result(timeout=LONG_POLL + WAIT)
        answered_after = time.monotonic() - deleted_at
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["code"] == "not_found"
    assert answered_after < ANSWERED_WITHIN, f"answered {answered_after:.1f} s after"
    # A receive after the deletion: the token's scope went with the group (decision 0088).
    later = receive(0)
    assert later.status_code == 403, later.text
    assert later.json()["error"]["code"] == "forbidden"
