"""The gRPC door while the database is unreachable (no primary during a failover, Postgres down):
HA_NOT_AVAILABLE, RocketMQ's unavailable-class code that its clients retry, as REST answers 503
`unavailable` (CONTRACT 7, docs/decisions/0042); any other failure stays INTERNAL_ERROR."""

import asyncio
from typing import Any

import pytest
from django.db import InterfaceError, OperationalError

from apps.broker.grpc.calls import unary
from apps.broker.grpc.protocol import Code, refusal_of, rpc
from apps.broker.services.errors import Unavailable


def _answer_to(error: Exception) -> Any:
    @unary(rpc.SendMessageResponse)
    async def send(self: Any, request: Any, context: Any) -> Any:
        raise error

    async def call() -> Any:
        return await send(None, None, None)

    return asyncio.run(call())


@pytest.mark.parametrize(
    "error", [OperationalError("connection refused"), InterfaceError("connection already closed")]
)
def test_a_database_outage_answers_ha_not_available(error: Exception) -> None:
    answer = _answer_to(error)
    assert answer.status.code == Code.HA_NOT_AVAILABLE
    assert "unavailable" in answer.status.message


def test_any_other_failure_is_still_an_internal_error() -> None:
    assert _answer_to(RuntimeError("a bug")).status.code == Code.INTERNAL_ERROR


def test_a_service_that_finds_something_unreachable_answers_ha_not_available() -> None:
    assert refusal_of(Unavailable("Redis is unreachable")).code == Code.HA_NOT_AVAILABLE
