"""CONTRACT invariant 9: bad input gets a clear 4xx in the contract's format and stores nothing.
One row per limit, sent both as a normal message and as a transaction."""

import base64
import json
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.test import RequestFactory
from rest_framework.test import APIClient

from apps.broker.api.errors import handler400, handler403
from apps.broker.models import CommitLogEntry, ConsumerGroup, HalfMessage, OpRecord, Topic
from tests.support.responses import assert_error

MIB4 = 4 * 1024 * 1024
GOOD = {"producer_group": "order-service", "body": "hello"}

CASES: list[tuple[str, dict[str, Any], int, str]] = [
    # (name, changes to a good message, status, field named in details)
    ("no body", {"body": None}, 400, "body"),
    ("both bodies", {"body_base64": "aGk="}, 400, "body"),
    ("empty body", {"body": ""}, 400, "body"),
    ("empty base64 body", {"body": None, "body_base64": ""}, 400, "body"),
    ("body not a string", {"body": 42}, 400, "body"),
    ("body_base64 not base64", {"body": None, "body_base64": "%%%"}, 400, "body_base64"),
    ("body over 4 MiB", {"body": "x" * (MIB4 + 1)}, 413, ""),
    (
        "base64 body over 4 MiB",
        {"body": None, "body_base64": base64.b64encode(b"\0" * (MIB4 + 1)).decode()},
        413,
        "",
    ),
    ("missing producer group", {"producer_group": None}, 400, "producer_group"),
    ("group name with a space", {"producer_group": "order service"}, 400, "producer_group"),
    ("group name too long", {"producer_group": "g" * 128}, 400, "producer_group"),
    ("reserved group prefix", {"producer_group": "rmq_sys_x"}, 400, "producer_group"),
    ("reserved txhub prefix", {"producer_group": "TXHUB_x"}, 400, "producer_group"),
    ("blank tag", {"tags": "  "}, 400, "tags"),
    ("tag with a bar", {"tags": "a|b"}, 400, "tags"),
    ("tag too long", {"tags": "t" * 129}, 400, "tags"),
    ("tags not a string", {"tags": ["a"]}, 400, "tags"),
    ("keys not a list", {"keys": "k"}, 400, "keys"),
    ("a key not a string", {"keys": [1]}, 400, "keys"),
    ("blank key", {"keys": [" "]}, 400, "keys"),
    ("properties not an object", {"properties": ["a"]}, 400, "properties"),
    ("property value not a string", {"properties": {"a": 1}}, 400, "properties"),
    ("129 properties", {"properties": {f"p{i}": "v" for i in range(129)}}, 400, "properties"),
    ("metadata over 16 KiB", {"properties": {"big": "v" * 16385}}, 400, "properties"),
    ("keys over 16 KiB", {"keys": ["k" * 9000, "k" * 9000]}, 400, "keys"),
    ("NUL in a property", {"properties": {"a": "x\u0000y"}}, 400, "properties"),
    ("empty property name", {"properties": {"": "x"}}, 400, "properties"),
    ("unknown field", {"tag": "TagA"}, 400, "tag"),
    ("delay level 0", {"delay_level": 0}, 400, "delay_level"),
    ("delay level out of range", {"delay_level": 19}, 400, "delay_level"),
    ("delay level as a string", {"delay_level": "3"}, 400, "delay_level"),
    (
        "both delay fields",
        {"delay_level": 3, "deliver_at": "2030-01-01T00:00:00+00:00"},
        400,
        "delay_level",
    ),
    ("deliver_at without offset", {"deliver_at": "2030-01-01T00:00:00"}, 400, "deliver_at"),
    ("deliver_at not a time", {"deliver_at": "tomorrow"}, 400, "deliver_at"),
    (
        "deliver_at beyond TXHUB_MAX_DELAY",
        {"deliver_at": "2099-01-01T00:00:00+00:00"},
        400,
        "deliver_at",
    ),
]


def message_with(changes: dict[str, Any]) -> dict[str, Any]:
    message = {**GOOD, **changes}
    return {key: value for key, value in message.items() if value is not None}


def assert_nothing_stored() -> None:
    assert HalfMessage.objects.count() == 0
    assert OpRecord.objects.count() == 0
    assert CommitLogEntry.objects.count() == 0


@pytest.mark.parametrize(("name", "changes", "status", "field"), CASES, ids=[c[0] for c in CASES])
def test_bad_message_is_refused_and_stores_nothing(
    api: APIClient, setup_topic: Any, name: str, changes: dict[str, Any], status: int, field: str
) -> None:
    setup_topic()
    for path, extra in (
        ("/api/v1/topics/orders/messages", {}),
        ("/api/v1/transactions", {"topic": "orders"}),
    ):
        response = api.post(path, {**message_with(changes), **extra}, format="json")
        error = assert_error(
            response, status, "payload_too_large" if status == 413 else "invalid_request"
        )
        if field:
            assert field in error["details"], error
    assert_nothing_stored()


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        ("{bad json", "application/json"),
        ("[1, 2]", "application/json"),
        ("", "application/json"),
        ("body=x", "application/x-www-form-urlencoded"),
        ("null", "application/json"),
    ],
)
def test_a_body_that_is_not_a_json_object_is_400(
    api: APIClient, setup_topic: Any, body: str, content_type: str
) -> None:
    setup_topic()
    response = api.generic(
        "POST", "/api/v1/topics/orders/messages", body, content_type=content_type
    )
    assert response.status_code in {400, 415}
    code = {400: "invalid_request", 415: "unsupported_media_type"}[response.status_code]
    assert_error(response, response.status_code, code)
    assert_nothing_stored()


def test_a_text_body_that_is_not_utf8_is_400(api: APIClient, setup_topic: Any) -> None:
    setup_topic()
    raw = '{"producer_group": "order-service", "body": "\\ud800"}'  # a lone surrogate
    response = api.generic(
        "POST", "/api/v1/topics/orders/messages", raw, content_type="application/json"
    )
    assert "body" in assert_error(response, 400, "invalid_request")["details"]
    assert_nothing_stored()


def test_an_unknown_topic_is_404_and_stores_nothing(api: APIClient, setup_topic: Any) -> None:
    setup_topic()
    response = api.post("/api/v1/topics/nope/messages", GOOD, format="json")
    assert_error(response, 404, "not_found")
    response = api.post("/api/v1/transactions", {**GOOD, "topic": "nope"}, format="json")
    assert_error(response, 404, "not_found")
    assert_nothing_stored()


def test_an_unknown_producer_group_is_404_and_stores_nothing(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    response = api.post(
        "/api/v1/transactions",
        {**GOOD, "topic": "orders", "producer_group": "ghost"},
        format="json",
    )
    assert_error(response, 404, "not_found")
    assert_nothing_stored()


def test_a_body_of_exactly_4_mib_is_accepted(api: APIClient, setup_topic: Any) -> None:
    setup_topic()
    payload = {**GOOD, "body": None, "body_base64": base64.b64encode(b"\1" * MIB4).decode()}
    response = api.post("/api/v1/topics/orders/messages", message_with(payload), format="json")
    assert response.status_code == 201
    assert len(bytes(CommitLogEntry.objects.get().body)) == MIB4


KIB16 = 16 * 1024


def test_metadata_of_exactly_16_kib_with_its_tag_is_accepted_and_a_byte_more_refused(
    api: APIClient, setup_topic: Any
) -> None:
    """The bound counts the tag's bytes and the keys' bytes (not characters): a tag of 128, a
    key of one two-byte character and a property filling the rest to exactly 16 KiB is stored;
    one byte more in the property is refused at both paths and stores nothing (decision 0107)."""
    setup_topic()
    tag, key = "t" * 128, "\u00fc"
    room = KIB16 - len(tag) - len(key.encode()) - len("p")

    def meta(value_bytes: int) -> dict[str, Any]:
        return {"tags": tag, "keys": [key], "properties": {"p": "v" * value_bytes}}

    for path, extra in (
        ("/api/v1/topics/orders/messages", {}),
        ("/api/v1/transactions", {"topic": "orders"}),
    ):
        response = api.post(path, {**message_with(meta(room + 1)), **extra}, format="json")
        assert "properties" in assert_error(response, 400, "invalid_request")["details"]
    assert_nothing_stored()
    for path, extra in (
        ("/api/v1/topics/orders/messages", {}),
        ("/api/v1/transactions", {"topic": "orders"}),
    ):
        response = api.post(path, {**message_with(meta(room)), **extra}, format="json")
        assert response.status_code == 201, response.content
    assert (HalfMessage.objects.count(), CommitLogEntry.objects.count()) == (1, 1)


def test_a_tag_of_128_characters_is_stored_whole_and_one_of_129_refused(
    api: APIClient, setup_topic: Any
) -> None:
    """The tag's bound (CONTRACT section 3, limits.MAX_TAG_CHARS) at both REST paths: a tag of
    exactly 128 characters is stored whole and one character more is refused, storing nothing
    (decision 0116)."""
    setup_topic()
    paths: list[tuple[str, dict[str, str]]] = [
        ("/api/v1/topics/orders/messages", {}),
        ("/api/v1/transactions", {"topic": "orders"}),
    ]
    for path, extra in paths:
        response = api.post(path, {**message_with({"tags": "t" * 129}), **extra}, format="json")
        assert "tags" in assert_error(response, 400, "invalid_request")["details"]
    assert_nothing_stored()
    for path, extra in paths:
        response = api.post(path, {**message_with({"tags": "t" * 128}), **extra}, format="json")
        assert response.status_code == 201, response.content
    assert CommitLogEntry.objects.get().tags == "t" * 128
    assert HalfMessage.objects.get().tags == "t" * 128


def test_a_request_too_large_to_read_is_413(api: APIClient, setup_topic: Any) -> None:
    setup_topic()
    huge = '{"producer_group": "order-service", "body": "' + "x" * (9 * 1024 * 1024) + '"}'
    response = api.generic(
        "POST", "/api/v1/topics/orders/messages", huge, content_type="application/json"
    )
    assert_error(response, 413, "payload_too_large")
    assert_nothing_stored()


@pytest.mark.parametrize(
    ("path", "payload", "field"),
    [
        ("/api/v1/topics", {"name": "bad name"}, "name"),
        ("/api/v1/topics", {"name": "rmq_sys_TRANS"}, "name"),
        ("/api/v1/topics", {"name": "t", "queues": 0}, "queues"),
        ("/api/v1/topics", {"name": "t", "queues": "4"}, "queues"),
        ("/api/v1/producer-groups", {"name": "g", "check_url": "not a url"}, "check_url"),
        ("/api/v1/producer-groups", {"name": "g", "check_url": 42}, "check_url"),
        (
            "/api/v1/producer-groups",
            {"name": "g", "check_url": "http://127.0.0.1:99999/"},
            "check_url",
        ),
        (
            "/api/v1/consumer-groups",
            {"name": "g", "max_delivery_attempts": 0},
            "max_delivery_attempts",
        ),
        ("/api/v1/consumer-groups", {"name": "g", "consume_from": "middle"}, "consume_from"),
        ("/api/v1/tokens", {"name": "t", "scopes": []}, "scopes"),
        ("/api/v1/tokens", {"name": "t", "scopes": ["root"]}, "scopes"),
        ("/api/v1/tokens", {"name": "t", "scopes": ["produce:bad name"]}, "scopes"),
    ],
)
def test_bad_administration_input_is_400_and_stores_nothing(
    api: APIClient, path: str, payload: dict[str, Any], field: str
) -> None:
    tokens_before = api.get("/api/v1/tokens").json()
    response = api.post(path, payload, format="json")
    error = assert_error(response, 400, "invalid_request")
    assert field in error["details"]
    assert Topic.objects.count() == 0
    assert ConsumerGroup.objects.count() == 0
    assert api.get("/api/v1/producer-groups").json() == []
    assert api.get("/api/v1/tokens").json() == tokens_before


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"topic": "orders", "max_messages": 0}, "max_messages"),
        ({"topic": "orders", "max_messages": 33}, "max_messages"),
        ({"topic": "orders", "invisible_seconds": 9}, "invisible_seconds"),
        ({"topic": "orders", "invisible_seconds": 43201}, "invisible_seconds"),
        ({"topic": "orders", "wait_seconds": 21}, "wait_seconds"),
        ({"topic": "orders", "tag_expression": "a || |"}, "tag_expression"),
        ({}, "topic"),
    ],
)
def test_bad_receive_input_is_400(
    api: APIClient, setup_topic: Any, payload: dict[str, Any], field: str
) -> None:
    setup_topic()
    response = api.post("/api/v1/consumer-groups/billing/receive", payload, format="json")
    assert field in assert_error(response, 400, "invalid_request")["details"]


def test_an_unknown_api_path_is_a_json_404(api: APIClient) -> None:
    response = api.get("/api/v1/no-such-thing")
    assert_error(response, 404, "not_found")


def test_a_wrong_method_answers_in_the_contract_format(api: APIClient) -> None:
    response = api.delete("/api/v1/topics")
    assert_error(response, 405, "method_not_allowed")


@pytest.mark.parametrize(
    ("handler", "exception", "status", "code"),
    [
        (handler400, SuspiciousOperation("x"), 400, "invalid_request"),
        (handler403, PermissionDenied(), 403, "forbidden"),
    ],
)
def test_djangos_own_400_and_403_are_json_on_api_paths_and_pages_elsewhere(
    handler: Any, exception: Exception, status: int, code: str
) -> None:
    factory = RequestFactory()
    answer = handler(factory.get("/api/v1/topics"), exception)
    assert (answer.status_code, answer["Content-Type"]) == (status, "application/json")
    assert json.loads(answer.content)["error"]["code"] == code
    page = handler(factory.get("/console/"), exception)
    assert page.status_code == status
    assert page["Content-Type"].startswith("text/html")
