"""Idempotency-Key is read one way on both doors (issue 24, item 13): the lean door (a plain
request) and Django's (the same request with a query string) through a real server. The
underscore form, which Django and proxies drop silently (a retry would then store twice), and a
repeated header with different values are 400 and store nothing; a repeated identical value is
one key."""

import http.client
import json
from typing import Any

import pytest

from apps.broker.models import HalfMessage
from apps.broker.services import registry

pytestmark = pytest.mark.e2e

PREPARE = {"producer_group": "shop", "topic": "orders", "body": "order 9527"}
DOORS = {"lean": "/api/v1/transactions", "django": "/api/v1/transactions?door=django"}


def prepare(base: str, path: str, headers: list[tuple[str, str]]) -> tuple[int, dict[str, Any]]:
    host, port = base.split("//")[1].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    body = json.dumps(PREPARE).encode()
    connection.putrequest("POST", path)
    for name, value in [
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(body))),
        *headers,
    ]:
        connection.putheader(name, value)
    connection.endheaders(body)
    answer = connection.getresponse()
    status, data = answer.status, json.loads(answer.read() or b"{}")
    connection.close()
    return status, data


@pytest.fixture
def producer(server: Any) -> tuple[str, str]:
    registry.topic_create(name="orders", queues=1)
    registry.producer_group_create(name="shop", check_url="https://127.0.0.1:9/")
    return server.base, registry.token_create(name="p", scopes=["produce:shop"])[1]


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize(
    "keys",
    [[("Idempotency_Key", "order-9527")], [("Idempotency-Key", "a"), ("Idempotency-Key", "b")]],
    ids=["underscore form", "repeated, different"],
)
def test_an_ambiguous_idempotency_key_is_400_on_both_doors(
    producer: tuple[str, str], door: str, keys: list[tuple[str, str]]
) -> None:
    base, token = producer
    status, data = prepare(base, DOORS[door], [("Authorization", f"Bearer {token}"), *keys])
    assert status == 400, data
    assert data["error"]["code"] == "invalid_request"
    assert "Idempotency-Key" in data["error"]["details"]
    assert HalfMessage.objects.count() == 0


@pytest.mark.parametrize("door", DOORS)
def test_a_repeated_identical_idempotency_key_is_one_key_on_both_doors(
    producer: tuple[str, str], door: str
) -> None:
    base, token = producer
    headers = [
        ("Authorization", f"Bearer {token}"),
        ("Idempotency-Key", "order-9527"),
        ("Idempotency-Key", "order-9527"),
    ]
    first = prepare(base, DOORS[door], headers)
    again = prepare(base, DOORS[door], headers[:2])  # the positive control: one header
    assert (first[0], again[0]) == (201, 201), (first, again)
    assert first[1]["transaction_id"] == again[1]["transaction_id"]
    assert HalfMessage.objects.count() == 1
