"""A ReceiveMessage the client cancels while its answers are being written (a consumer shutting
down, a client's deadline): a client leaving is normal, and the server logs it as grpc logs any
cancelled RPC, one DEBUG line, never an ERROR with a traceback (grpc.aio's ExecuteBatchError
from the failed write, which it logged at ERROR when it had not yet seen the cancel). The
messages the receive had reserved and not written are given back, as RocketMQ's proxy nacks
them: visible again in a second, on their next attempt, nothing lost (decisions 0104, 0115). So
are those its first try reserves in the database after the client left (0115, its follow-up). A
real error in either place is still an ERROR.

The server is txhub's own, served in the test's process so that caplog sees its log
(tests/support/grpc_in_process.py); the client is grpcio's, over a real connection."""

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest
from django.db import DatabaseError, connection, transaction
from google.protobuf.duration_pb2 import Duration
from rocketmq import ClientConfiguration, Credentials
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.util.signature import Signature

from apps.broker import limits
from apps.broker.models import CommitLogEntry, Delivery, DeliveryState, Topic
from apps.broker.services import sending
from tests.grpc.conftest import Setup
from tests.support.grpc_in_process import grpc_in_process
from tests.support.lock_waits import until, waiting_for_a_lock
from tests.support.own_connection import in_thread
from tests.support.waiting import wait_until

# More than the connection's flow-control window holds: the server's writes wait for the client
# to read, and the cancel finds one of them under way.
MESSAGES = 16
BODY = 1024 * 1024
INVISIBLE = limits.MIN_INVISIBLE_SECONDS
BOUND = 30.0  # seconds a step may take (a bound, not a measurement)
RECEIVE = "/apache.rocketmq.v2.MessagingService/ReceiveMessage"
# The client's stream window stays at 64 KiB (no BDP probe growing it): the first 1 MiB message
# waits for the client, which never reads it, so none is written.
WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 65536)]
# Messages a receive never wrote are back within this (RocketMQ's nack: 1 s), well under the
# receive's invisible time, when they would be back without being given back.
GIVEN_BACK_BOUND = INVISIBLE / 2
# A receive cancelled in its first try: a few small messages, all reserved by that try.
FIRST_TRY_MESSAGES = 4


@pytest.fixture
def endpoint(transactional_db: None) -> Iterator[str]:
    with grpc_in_process() as address:
        yield address


def metadata(endpoint: str, setup: Setup) -> list[tuple[str, str]]:
    config = ClientConfiguration(endpoint, Credentials(setup.access_key, setup.secret_key))
    return list(Signature.metadata(config, "client-cancelling"))


def receive_request(setup: Setup) -> Any:
    return rpc.ReceiveMessageRequest(
        group=pb.Resource(name=setup.consumer),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=setup.topic), id=-1),
        batch_size=MESSAGES,
        invisible_duration=Duration(seconds=INVISIBLE),
        long_polling_timeout=Duration(seconds=0),
    )


def in_flight() -> int:
    return Delivery.objects.filter(state=DeliveryState.INFLIGHT).count()


def received_messages(stub: MessagingServiceStub, meta: Any, setup: Setup) -> list[Any]:
    """The messages one receive gets (each with its delivery attempt)."""
    answers = list(stub.ReceiveMessage(receive_request(setup), metadata=meta, timeout=BOUND))
    return [answer.message for answer in answers if answer.HasField("message")]


def received_by_another_consumer(
    endpoint: str, setup: Setup, count: int, *, within: float
) -> list[Any]:
    """What receives of another client get until they have `count` messages, within `within` s."""
    config = ClientConfiguration(endpoint, Credentials(setup.access_key, setup.secret_key))
    meta = list(Signature.metadata(config, "client-taking-over"))
    got: list[Any] = []
    with grpc.insecure_channel(endpoint) as channel:
        stub = MessagingServiceStub(channel)

        def all_of_them() -> bool:
            got.extend(received_messages(stub, meta, setup))
            return len(got) >= count

        wait_until(all_of_them, timeout=within, interval=0.1)
    return got


def about_the_receive(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """What the server logged naming the ReceiveMessage RPC: (level, message)."""
    records = list(caplog.records)
    return [(r.levelno, r.getMessage()) for r in records if RECEIVE in r.getMessage()]


def send(setup: Setup, count: int, body: int = BODY) -> None:
    topic = Topic.objects.get(name=setup.topic)
    for n in range(count):
        sending.message_send(
            topic=topic,
            message=sending.OutgoingMessage(setup.producer, bytes([n]) * body, False),
        )


def group_row_held(setup: Setup, held: threading.Event, release: threading.Event) -> None:
    """The consumer group's row held FOR UPDATE on a connection of its own until `release`: a
    receive's transaction waits for it at its first statement (group_locks.hold_for_receive)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM broker_consumergroup WHERE name = %s FOR UPDATE", [setup.consumer]
        )
        held.set()
        assert release.wait(BOUND)


def test_a_receive_cancelled_while_answering_logs_no_error_and_gives_back_what_it_held(
    endpoint: str,
    rocketmq_setup: Callable[..., Setup],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    setup = rocketmq_setup()
    meta = metadata(endpoint, setup)
    send(setup, MESSAGES)
    with grpc.insecure_channel(endpoint, options=WINDOW) as channel:
        stub = MessagingServiceStub(channel)
        call = stub.ReceiveMessage(receive_request(setup), metadata=meta, timeout=BOUND)
        # Reserved: every message is in flight for this receive, whose answers wait to be read.
        wait_until(lambda: in_flight() == MESSAGES, timeout=BOUND)
        first = next(call)
        assert first.status.code == pb.Code.OK, first.status
        call.cancel()
        cancelled = time.monotonic()
        # The cancel itself is one DEBUG line, grpc's own for any RPC a client cancels.
        wait_until(lambda: about_the_receive(caplog), timeout=BOUND)
        assert about_the_receive(caplog) == [
            (logging.DEBUG, f"RPC cancelled for servicer method [{RECEIVE}]")
        ]
    # Nothing lost: none of them was written (the first waited for the client's window), so each
    # is given back, as RocketMQ's proxy nacks them, and another consumer receives it well
    # before the receive's invisible time is over, on its second attempt (RocketMQ's revive
    # counts the reservation as an attempt too).
    again = received_by_another_consumer(endpoint, setup, MESSAGES, within=GIVEN_BACK_BOUND)
    assert time.monotonic() - cancelled < INVISIBLE
    assert sorted(m.body[0] for m in again) == list(range(MESSAGES))
    assert {m.system_properties.delivery_attempt for m in again} == {2}
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == []
    assert len(about_the_receive(caplog)) == 1


@contextmanager
def left_in_its_first_try(
    endpoint: str, setup: Setup, caplog: pytest.LogCaptureFixture
) -> Iterator[None]:
    """A receive whose client cancels while its first try waits in the database (for the group's
    row, held here); the block runs once the server saw the cancel, the row still held."""
    held, release = threading.Event(), threading.Event()
    holder = in_thread(lambda: group_row_held(setup, held, release))
    try:
        assert held.wait(BOUND)
        with grpc.insecure_channel(endpoint) as channel:
            stub = MessagingServiceStub(channel)
            meta = metadata(endpoint, setup)
            call = stub.ReceiveMessage(receive_request(setup), metadata=meta, timeout=BOUND)
            # The first try is in the database, waiting for the group's row.
            assert until(lambda: waiting_for_a_lock("FOR KEY SHARE"))
            call.cancel()
            # The server saw the cancel: the RPC's task was cancelled while the try waited.
            wait_until(lambda: about_the_receive(caplog), timeout=BOUND)
        yield
    finally:
        release.set()
        holder.result(timeout=BOUND)


def test_a_receive_cancelled_in_its_first_try_gives_back_what_the_try_reserved(
    endpoint: str,
    rocketmq_setup: Callable[..., Setup],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client leaves while the receive's own first try waits in the database: the try still
    reserves the messages once it goes on, and they are given back as if written to a client that
    left, not kept for the receive's invisible time (decision 0115, its follow-up)."""
    caplog.set_level(logging.DEBUG)
    setup = rocketmq_setup()
    send(setup, FIRST_TRY_MESSAGES, body=1)
    with left_in_its_first_try(endpoint, setup, caplog):
        pass
    released = time.monotonic()
    # The try went on and reserved every message, for a client that is gone.
    wait_until(lambda: in_flight() == FIRST_TRY_MESSAGES, timeout=BOUND)
    again = received_by_another_consumer(
        endpoint, setup, FIRST_TRY_MESSAGES, within=GIVEN_BACK_BOUND
    )
    assert time.monotonic() - released < INVISIBLE
    assert sorted(m.body[0] for m in again) == list(range(FIRST_TRY_MESSAGES))
    assert {m.system_properties.delivery_attempt for m in again} == {2}
    assert about_the_receive(caplog) == [
        (logging.DEBUG, f"RPC cancelled for servicer method [{RECEIVE}]")
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == []


def test_a_first_try_failing_after_its_client_left_is_still_an_error(
    endpoint: str,
    rocketmq_setup: Callable[..., Setup],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The try its client left fails on a statement Postgres cancels (57014, a failed query, not
    an unreachable database): the error is logged with its traceback, as if it were answered,
    and nothing stays reserved."""
    caplog.set_level(logging.DEBUG)
    setup = rocketmq_setup()
    send(setup, FIRST_TRY_MESSAGES, body=1)
    with left_in_its_first_try(endpoint, setup, caplog), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND strpos(query, 'FOR KEY SHARE') > 0 AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchone() == (True,)
        failed = wait_until(
            lambda: [r for r in caplog.records if r.levelno >= logging.ERROR], timeout=BOUND
        )
    [error] = failed
    assert error.getMessage() == "gRPC ReceiveMessage failed"
    assert error.exc_info is not None
    assert isinstance(error.exc_info[1], DatabaseError)
    assert "canceling statement" in str(error.exc_info[1])
    assert in_flight() == 0


def test_an_answer_that_cannot_be_written_is_still_an_error(
    endpoint: str,
    rocketmq_setup: Callable[..., Setup],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A real failure where the answers are written, a stored message the protocol cannot
    carry (a property that is not a string), is logged as an error with its traceback, and the
    client is told INTERNAL in plain words, not grpcio's UNKNOWN naming a Python class."""
    setup = rocketmq_setup()
    meta = metadata(endpoint, setup)
    send(setup, 1)
    CommitLogEntry.objects.update(properties={"order": 9527})
    with grpc.insecure_channel(endpoint) as channel:
        stub = MessagingServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failed:
            received_messages(stub, meta, setup)
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert failed.value.details() == "Internal error."
    [error] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "ReceiveMessage" in error.getMessage()
    assert error.exc_info is not None
    assert error.exc_info[0] is TypeError
