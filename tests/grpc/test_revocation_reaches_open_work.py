"""Revoking a token ends what it holds open, in the processes that hold it (docs/decisions/0034):
its Telemetry streams close, its waiting receives end answering as an unauthenticated call would
(gRPC UNAUTHORIZED, REST 401), over the real gRPC server and the real ASGI gunicorn. The
revocation is the service DELETE /api/v1/tokens/{id} runs; it reaches them through Postgres
NOTIFY on the wake-up hubs' channel."""

import signal
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import grpc
import pytest
import requests
from django.utils import timezone
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker import config_cache
from apps.broker.models import ApiToken
from apps.broker.services import registry
from tests.conftest import Server, db_url_for_tests, start_gunicorn
from tests.grpc.conftest import GrpcServer, own_server
from tests.support import workers
from tests.support.grpc import WAIT, Telemetry, signed
from tests.support.listening import database_now, hub_listening
from tests.support.own_connection import in_thread
from tests.support.ports import free_port

# The web server whose long poll a revocation ends, named so that its LISTEN connection can be
# seen waiting in pg_stat_activity (decision 0115); and the gRPC server, likewise (0116).
QUIET_HUB = "revocation-rest"
QUIET_GRPC = "revocation-grpc"

pytestmark = pytest.mark.e2e


@pytest.fixture
def quiet_grpc_server(django_db_setup: None) -> Iterator[GrpcServer]:
    """A gRPC server of the test's own whose wake-up hub makes no fallback check within a test's
    time, and whose receives may wait 20 s: what ends a waiting receive or a Telemetry stream
    there came by the NOTIFY."""
    yield from own_server(
        "test-grpc-revocation.log",
        {
            "DATABASE_URL": f"{db_url_for_tests()}?application_name={QUIET_GRPC}",
            "TXHUB_LONG_POLL_FALLBACK": "60",
            "TXHUB_GRPC_LONG_POLL_MAX": "20",
        },
    )


def test_revoking_a_token_closes_its_streams_and_ends_its_grpc_long_poll(
    quiet_grpc_server: GrpcServer, rocketmq_setup: Any
) -> None:
    """The receive waits before the token is revoked: it started the server's LISTEN
    connection, which has run its catch-up check for it and idles. The streams are opened after
    that check. Only the revocation's NOTIFY can end the receive and the stream then, within the
    receive's 20 s (decision 0116)."""
    server = quiet_grpc_server
    doomed, other = rocketmq_setup("-doomed"), rocketmq_setup("-spared")
    receive = rpc.ReceiveMessageRequest(
        group=pb.Resource(name=doomed.consumer),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=doomed.topic), id=-1),
        long_polling_timeout={"seconds": 20},
    )
    meta = signed(server, doomed, "doomed-host@1@0@consumer")
    with grpc.insecure_channel(server.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        since = database_now()
        # Its exception, if any, is raised by result() (decision 0116).
        poll = in_thread(lambda: list(stub.ReceiveMessage(receive, metadata=meta)))
        hub_listening(f"{QUIET_GRPC}-wakeups", since=since)
        assert not poll.done(), poll.result()  # ended before the revocation: its answer or error
        doomed_stream = Telemetry(stub, signed(server, doomed, "doomed-host@1@0@producer"))
        other_stream = Telemetry(stub, signed(server, other, "spared-host@1@0@producer"))
        try:
            assert doomed_stream.settings(doomed.topic).status.code == pb.Code.OK
            assert other_stream.settings(other.topic).status.code == pb.Code.OK
            assert not poll.done(), poll.result()
            registry.token_revoke(token_id=doomed.token_id)
            # TimeoutError, or the answer of a wait that ran out: the revoked receive waited on.
            [answer] = poll.result(timeout=WAIT)
            assert answer.status.code == pb.Code.UNAUTHORIZED, answer.status
            assert "revoked" in answer.status.message
            last = doomed_stream.next()  # queue.Empty: the revoked token's stream is still open
            assert last is not None, "the stream ended without saying why"
            assert last.status.code == pb.Code.UNAUTHORIZED, last
            assert doomed_stream.next() is None, "the revoked token's stream is still open"
            # Positive control: another token's stream is untouched.
            assert other_stream.settings(other.topic).status.code == pb.Code.OK
        finally:
            doomed_stream.close()
            other_stream.close()


@pytest.fixture
def quiet_hub_server(transactional_db: None) -> Iterator[Server]:
    """A gunicorn of the test's own, one worker, whose wake-up hub makes no fallback check within
    a test's time: what ends a waiting long poll there came by the NOTIFY."""
    port = free_port()
    env = {
        "DATABASE_URL": f"{db_url_for_tests()}?application_name={QUIET_HUB}",
        "TXHUB_LONG_POLL_FALLBACK": "60",
    }
    with open(workers.log_path("test-gunicorn-revocation.log"), "w") as log:
        process = start_gunicorn(port, workers=1, log=log, extra_env=env)
        yield Server(f"http://127.0.0.1:{port}")
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def test_revoking_a_token_ends_its_rest_long_poll_with_401(quiet_hub_server: Server) -> None:
    """The long poll waits before the token is revoked: the server's LISTEN connection has run
    its catch-up check for it (which would have seen a revocation made earlier) and idles. Only
    the revocation's NOTIFY can end it then, within the poll's 20 s (decision 0115)."""
    server = quiet_hub_server
    registry.topic_create(name="revoked-rest", queues=1)
    registry.consumer_group_create(
        name="revoked-rest-c", max_delivery_attempts=16, consume_from="first"
    )
    token, raw = registry.token_create(name="doomed-rest", scopes=["consume:revoked-rest-c"])

    def long_poll() -> requests.Response:
        return requests.post(
            server.url("/api/v1/consumer-groups/revoked-rest-c/receive"),
            json={"topic": "revoked-rest", "wait_seconds": 20},
            headers={"Authorization": f"Bearer {raw}"},
            timeout=WAIT + 20,
        )

    # Its exception, if any, is raised by result() (decision 0116).
    since = database_now()
    poll = in_thread(long_poll)
    hub_listening(f"{QUIET_HUB}-wakeups", since=since)
    assert not poll.done(), poll.result()  # ended before the revocation: its answer or error
    registry.token_revoke(token_id=token.pk)
    answer = poll.result(timeout=WAIT)  # TimeoutError: the revoked token's long poll still waits
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"]["code"] == "unauthenticated"


def test_a_revocation_scheduled_for_later_ends_a_rest_long_poll_only_from_its_time(
    server: Server,
) -> None:
    """The wake-up hub's catch-up asks Postgres which watched tokens are revoked by now
    (access.REVOKED_SQL): a revocation scheduled an hour ahead leaves a long poll waiting through
    its fallback checks (one a second) to its end; one due during the wait ends it with 401."""
    registry.topic_create(name="scheduled-rest", queues=1)
    registry.consumer_group_create(
        name="scheduled-rest-c", max_delivery_attempts=16, consume_from="first"
    )
    token, raw = registry.token_create(name="scheduled-rest", scopes=["consume:scheduled-rest-c"])

    def long_poll(wait_seconds: int) -> tuple[requests.Response, float]:
        started = time.monotonic()
        answer = requests.post(
            server.url("/api/v1/consumer-groups/scheduled-rest-c/receive"),
            json={"topic": "scheduled-rest", "wait_seconds": wait_seconds},
            headers={"Authorization": f"Bearer {raw}"},
            timeout=WAIT + wait_seconds,
        )
        return answer, time.monotonic() - started

    def schedule(seconds: float) -> None:
        later = timezone.now() + timedelta(seconds=seconds)
        ApiToken.objects.filter(pk=token.pk).update(revoked_at=later)
        config_cache.changed()

    schedule(3600)
    answer, took = long_poll(3)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"messages": []}
    assert took >= 2.5, took  # waited through its fallback checks, to its end
    # Positive control: a revocation due two seconds into the wait ends it there.
    schedule(2)
    answer, took = long_poll(20)
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"]["code"] == "unauthenticated"
    assert took < 10, took
