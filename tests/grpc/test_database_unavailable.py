"""The gRPC door while the database is unreachable (no primary during a failover, Postgres down):
HA_NOT_AVAILABLE, RocketMQ's unavailable-class code that its clients retry, as REST answers 503
`unavailable` (CONTRACT 7, docs/decisions/0042). Only an error that says the database cannot be
reached counts (services/errors.database_unreachable): one query that fails (libpq refusing it,
a statement timeout) is INTERNAL_ERROR, which clients do not retry forever. The errors are
Postgres's and psycopg's own, raised on real connections where they can be."""

import asyncio
from typing import Any

import psycopg
import pytest
from django.db import InterfaceError, OperationalError, connection
from psycopg_pool import PoolTimeout

from apps.broker.grpc.calls import db, unary
from apps.broker.grpc.protocol import Code, refusal_of, rpc
from apps.broker.services.errors import Unavailable


def _answer_to(work: Any) -> Any:
    """A unary RPC whose synchronous part is `work`, run as the door runs it (calls.db)."""

    @unary(rpc.SendMessageResponse)
    async def send(self: Any, request: Any, context: Any) -> Any:
        await db(work)
        return rpc.SendMessageResponse()

    async def call() -> Any:
        return await send(None, None, None)

    return asyncio.run(call())


def _raise(error: Exception) -> Any:
    def work() -> None:
        raise error

    return work


def _lose_the_connection() -> None:
    with connection.cursor() as cursor:  # Postgres ends this session: AdminShutdown (57P01)
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")


def _too_many_parameters() -> None:
    with connection.cursor() as cursor:  # libpq refuses to send it; the connection is fine
        cursor.execute("SELECT 1 WHERE 1 IN (" + ", ".join(["%s"] * 70_000) + ")", [1] * 70_000)


def _statement_timeout() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = 10")
        try:
            cursor.execute("SELECT pg_sleep(1)")
        finally:
            cursor.execute("RESET statement_timeout")


def _wrapped(driver: Exception) -> OperationalError:
    """A driver's error as Django raises it (django.db.utils.DatabaseErrorWrapper)."""
    error = OperationalError(str(driver))
    error.__cause__ = driver
    return error


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "work",
    [
        _lose_the_connection,
        _raise(_wrapped(PoolTimeout("couldn't get a connection after 10.00 sec"))),
        _raise(_wrapped(psycopg.errors.CannotConnectNow("the database system is starting up"))),
        _raise(InterfaceError("connection already closed")),
    ],
    ids=["connection lost", "pool timeout", "starting up", "connection closed"],
)
def test_a_database_outage_answers_ha_not_available(work: Any) -> None:
    answer = _answer_to(work)
    assert answer.status.code == Code.HA_NOT_AVAILABLE, answer.status
    assert "unavailable" in answer.status.message


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "work",
    [_too_many_parameters, _statement_timeout, _raise(RuntimeError("a bug"))],
    ids=["too many parameters", "statement timeout", "a bug"],
)
def test_a_failed_query_or_any_other_failure_is_an_internal_error(work: Any) -> None:
    answer = _answer_to(work)
    assert answer.status.code == Code.INTERNAL_ERROR, answer.status


def test_a_service_that_finds_something_unreachable_answers_ha_not_available() -> None:
    assert refusal_of(Unavailable("Redis is unreachable")).code == Code.HA_NOT_AVAILABLE
