"""A check sent on a producer's Telemetry stream is sent only for a transaction that is still
PREPARED under the half row's lock (CONTRACT invariant 7): a producer's commit that lands between
check-back's first read and its lock sends nothing (services/checkback.py, decision 0023)."""

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.db import connection

from apps.broker import failpoints
from apps.broker.models import HalfMessage, OpRecord
from apps.broker.services import checkback, checkback_stream, clients, registry, transactions
from tests.support.transactions import PRODUCER, make_due, make_group, prepare

CLIENT = "shop-host@101@0@producer"
# Redis channels are shared by every database and so by every test worker: a name of this run's.
PROCESS = f"grpc-host-{uuid.uuid4().hex[:8]}:4242"


@pytest.fixture
def stream_process(settings: Any) -> Iterator[Any]:
    """The gRPC process holding CLIENT's stream, as Redis sees it: a subscriber to its channel."""
    listener = redis.Redis.from_url(settings.CELERY_BROKER_URL).pubsub()  # type: ignore[no-untyped-call]
    listener.subscribe(checkback_stream.CHANNEL_PREFIX + PROCESS)
    assert listener.get_message(timeout=5)["type"] == "subscribe"
    try:
        yield listener
    finally:
        listener.close()


def published(listener: Any) -> list[str]:
    """The transaction ids of the checks published to the process so far."""
    ids = []
    while (note := listener.get_message(timeout=0.5)) is not None:
        if note["type"] == "message":
            ids.append(json.loads(note["data"])["transaction_id"])
    return ids


def commit_from_another_connection(half: HalfMessage) -> None:
    """The producer's own commit, made and committed on a connection of its own meanwhile."""

    def commit() -> None:
        try:
            transactions.transaction_commit(transaction_id=half.transaction_id, actor=PRODUCER)
        finally:
            connection.close()

    thread = threading.Thread(target=commit)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_commit_between_the_checks_read_and_its_lock_sends_no_check(
    transactional_db: None, stream_process: Any
) -> None:
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    token, _ = registry.token_create(name="rocketmq", scopes=[f"produce:{group.name}"])
    clients.client_seen(client_id=CLIENT, token_id=token.pk, client_type="PRODUCER", group="shop")
    clients.client_stream_opened(client_id=CLIENT, token_id=token.pk, process=PROCESS)
    resolved, control = prepare(group, topic), prepare(group, topic)
    make_due(resolved, control)
    assert sorted(checkback.checkback_claim_due()) == sorted([resolved.pk, control.pk])
    errors: list[BaseException] = []

    def producer_commits() -> None:
        # The site between check-back's read of the half and its lock: the producer commits.
        if not errors:
            try:
                commit_from_another_connection(resolved)
            except BaseException as error:  # seen by the test below, not lost with the step
                errors.append(error)
                raise

    with failpoints.armed_here("after_check_read_before_lock", producer_commits):
        outcome = checkback.checkback_run(half_id=resolved.pk)
    assert errors == []
    resolved.refresh_from_db()
    assert resolved.state == "COMMITTED"
    assert published(stream_process) == []
    assert outcome == "skipped"
    assert resolved.checking_until is None
    assert not OpRecord.objects.filter(half=resolved, op="CHECK").exists()
    # The positive control: a transaction still PREPARED is sent to the process.
    assert checkback.checkback_run(half_id=control.pk) == "unknown"
    assert published(stream_process) == [str(control.transaction_id)]


@pytest.fixture
def redis_that_never_accepts() -> Iterator[str]:
    """A Redis URL whose connects hang: a listener whose accept queue is full drops the SYN of
    any further connection (a Redis master that vanished from the network looks the same)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    filler = socket.create_connection(listener.getsockname(), timeout=5)
    try:
        host, port = listener.getsockname()
        yield f"redis://{host}:{port}/0"
    finally:
        filler.close()
        listener.close()


def test_a_redis_that_does_not_answer_its_connect_holds_the_lock_briefly(
    db: None, settings: Any, redis_that_never_accepts: str
) -> None:
    """checkback_run holds the half row's lock while it publishes a stream check: connecting to
    Redis is bounded like the publish itself (2 s), not by redis-py's 5 s default."""
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    token, _ = registry.token_create(name="rocketmq", scopes=[f"produce:{group.name}"])
    clients.client_seen(client_id=CLIENT, token_id=token.pk, client_type="PRODUCER", group="shop")
    clients.client_stream_opened(client_id=CLIENT, token_id=token.pk, process=PROCESS)
    half = HalfMessage.objects.select_related("producer_group", "topic").get(
        pk=prepare(group, topic).pk
    )
    settings.CELERY_BROKER_URL = redis_that_never_accepts
    started = time.monotonic()
    assert checkback_stream.checkback_send(half=half) is None  # not sent: HTTP is tried
    elapsed = time.monotonic() - started
    assert 1.5 <= elapsed < 4.5, elapsed  # the connect's own bound, not the 5 s default
