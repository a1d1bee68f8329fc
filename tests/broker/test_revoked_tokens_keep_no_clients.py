"""A revoked token keeps no RocketMQ client row (docs/decisions/0101), also when a call of the
token authenticated just before the revocation claims a new client id meanwhile. Both orders,
on real concurrent transactions: the claim first (held at its insert by a trigger of the test's
own, decision 0098), then the revocation deletes its row once the claim commits; the revocation
first, then the claim finds the token revoked and stores nothing."""

import time
from collections.abc import Iterator

import psycopg
import pytest

from apps.broker.models import GrpcClient
from apps.broker.services import clients, registry
from apps.broker.services.errors import Unauthenticated
from tests.support.killed_mid_write import SECONDS, inserts_wait
from tests.support.own_connection import in_thread
from tests.support.statement_faults import own_connection

# The advisory lock each insert of a client row waits for while the test holds it.
STEP = 0x7478_6841


@pytest.fixture
def producer_token(transactional_db: None) -> int:
    registry.producer_group_create(name="shop")
    token, _ = registry.token_create(name="producer", scopes=["produce:shop"])
    return int(token.pk)


@pytest.fixture
def client_inserts_wait(transactional_db: None) -> Iterator[None]:
    with inserts_wait("broker_grpcclient", STEP, name="client_rows_test_wait"):
        yield


def blocked_sessions(holder: psycopg.Connection) -> int:
    with own_connection(autocommit=True) as watcher:
        row = watcher.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> %s AND cardinality(pg_blocking_pids(pid)) > 0",
            [holder.info.backend_pid],
        ).fetchone()
    return int(row[0]) if row else 0


def seen(token_id: int, client_id: str) -> None:
    clients.client_seen(client_id=client_id, token_id=token_id, client_type="PRODUCER")


def test_a_client_claimed_while_its_token_is_revoked_is_deleted_with_the_others(
    producer_token: int, client_inserts_wait: None
) -> None:
    seen(producer_token, "host@1@0@producer")  # a client of the token's before
    with own_connection(autocommit=False) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", [STEP])
        claim = in_thread(lambda: seen(producer_token, "host@2@0@producer"))
        deadline = time.monotonic() + SECONDS
        while blocked_sessions(holder) < 1:  # the claim waits at its insert
            assert time.monotonic() < deadline, "the claim never reached its insert"
            time.sleep(0.02)
        revoke = in_thread(lambda: registry.token_revoke(token_id=producer_token))
        # The revocation waits for the claim (two sessions blocked), or is done.
        while blocked_sessions(holder) < 2 and not revoke.done():
            assert time.monotonic() < deadline, "the revocation neither waited nor finished"
            time.sleep(0.02)
        holder.rollback()  # the claim inserts and commits
        claim.result(timeout=SECONDS)
        revoke.result(timeout=SECONDS)
    assert not GrpcClient.objects.filter(token_id=producer_token).exists()


def test_a_client_claimed_after_its_token_was_revoked_is_refused_and_stores_nothing(
    producer_token: int,
) -> None:
    seen(producer_token, "host@1@0@producer")
    registry.token_revoke(token_id=producer_token)
    assert not GrpcClient.objects.filter(token_id=producer_token).exists()
    # Calls authenticated before the revocation: a heartbeat, a stream opened.
    with pytest.raises(Unauthenticated):
        seen(producer_token, "host@1@0@producer")
    with pytest.raises(Unauthenticated):
        clients.client_stream_opened(
            client_id="host@2@0@producer", token_id=producer_token, process="host:1"
        )
    assert not GrpcClient.objects.filter(token_id=producer_token).exists()
    # The positive control: a live token's new client is kept.
    live, _ = registry.token_create(name="live", scopes=["produce:shop"])
    seen(live.pk, "host@1@0@producer")
    assert GrpcClient.objects.filter(token_id=live.pk).count() == 1
