"""Issue 9, hostile input: families, not examples. Each table of hostile values (NUL, lone
surrogate, newline, overlong, unicode digits, huge ints, deep nesting, out-of-range times) is
crossed with every path parameter, query parameter and JSON field that takes it; every answer is
a 4xx in the contract's format and no table changes (CONTRACT invariant 9)."""

import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from apps.broker.api.errors import MAX_ERROR_BYTES
from tests.support.console import login
from tests.support.responses import assert_error

GOOD = {"producer_group": "order-service", "body": "hello"}
TX = {**GOOD, "topic": "orders"}
# An error answer stays small whatever the input (MAX_ERROR_BYTES of details, and the envelope).
ERROR_SIZE = MAX_ERROR_BYTES + 1024


def table_counts() -> dict[str, int]:
    """Rows in every table of the project's own models, read in one statement."""
    models = [m for m in apps.get_models() if m._meta.app_label in {"broker", "console"}]
    quote = connection.ops.quote_name
    # Table names from the models, quoted: nothing of a test's input.
    counts = ", ".join(f"(SELECT count(*) FROM {quote(m._meta.db_table)})" for m in models)  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {counts}")
        row = cursor.fetchone()
    return {model._meta.label: int(count) for model, count in zip(models, row, strict=True)}


@pytest.fixture
def world(api: APIClient, setup_topic: Callable[..., Any]) -> Callable[[], None]:
    """A topic, groups and tokens exist; returns a check that nothing was stored since."""
    setup_topic()
    before = table_counts()

    def nothing_stored() -> None:
        assert table_counts() == before

    return nothing_stored


def send_json(client: APIClient, method: str, path: str, payload: Any) -> Any:
    """The payload as JSON with ASCII escapes: a lone surrogate travels as "\\ud800"."""
    compact = (",", ":")
    body = payload if isinstance(payload, str | bytes) else json.dumps(payload, separators=compact)
    return client.generic(method, path, body, content_type="application/json")  # type: ignore[arg-type]


# Path parameters -------------------------------------------------------------------------------

BAD_SEGMENTS = {
    "NUL": "%00",
    "NUL inside": "orders%00x",
    "lone surrogate (UTF-8 bytes)": "%ED%A0%80",
    "invalid UTF-8": "%FF",
    "trailing newline": "orders%0A",
    "overlong": "g" * 128,
    "unicode digit": "%C2%B2",
    "space": "a%20b",
    "dot segment": "..%2F",
}
BAD_IDS = {
    **BAD_SEGMENTS,
    "above bigint": "99999999999999999999",
    "19 digits": "9" * 19,
    "negative": "-1",
    "fullwidth digit": "%EF%BC%91",
}
MSG = "0" * 32
NAME_PATHS = [
    ("GET", "/api/v1/topics/{}"),
    ("POST", "/api/v1/topics/{}/messages"),
    ("GET", "/api/v1/producer-groups/{}"),
    ("PATCH", "/api/v1/producer-groups/{}"),
    ("POST", "/api/v1/producer-groups/{}/rotate-secret"),
    ("GET", "/api/v1/consumer-groups/{}"),
    ("POST", "/api/v1/consumer-groups/{}/receive"),
    ("POST", "/api/v1/consumer-groups/{}/ack"),
    ("POST", "/api/v1/consumer-groups/{}/change-invisible"),
    ("GET", "/api/v1/consumer-groups/{}/dlq"),
    ("POST", "/api/v1/consumer-groups/{}/dlq/" + MSG + "/resend"),
    ("POST", "/api/v1/consumer-groups/billing/dlq/{}/resend"),
    ("GET", "/api/v1/messages/{}"),
]
ID_PATHS = [
    ("DELETE", "/api/v1/tokens/{}"),
    ("GET", "/api/v1/reconciliations/{}"),
    ("GET", "/api/v1/transactions/{}"),
    ("POST", "/api/v1/transactions/{}/commit"),
    ("POST", "/api/v1/transactions/{}/rollback"),
    ("POST", "/api/v1/transactions/{}/resume"),
]
PATH_CASES = [
    pytest.param(method, template, value, id=f"{method} {template} {what}")
    for method, template in NAME_PATHS
    for what, value in BAD_SEGMENTS.items()
] + [
    pytest.param(method, template, value, id=f"{method} {template} {what}")
    for method, template in ID_PATHS
    for what, value in BAD_IDS.items()
]


@pytest.mark.parametrize(("method", "template", "value"), PATH_CASES)
def test_a_hostile_path_parameter_is_a_json_404_and_stores_nothing(
    api: APIClient, world: Callable[[], None], method: str, template: str, value: str
) -> None:
    payload = {**GOOD, "check_url": "http://127.0.0.1:9/", "receipt_handles": ["1.a"]}
    response = send_json(api, method, template.format(value), payload)
    assert_error(response, 404, "not_found", shorter_than=ERROR_SIZE)
    world()


def well_formed(template: str) -> str:
    """A value each route's converter takes (the object need not exist)."""
    if "/transactions/" in template:
        return str(uuid.uuid4())
    if template.endswith(("/tokens/{}", "/reconciliations/{}")):
        return "7"
    if template.endswith(("/dlq/{}/resend", "/messages/{}")):
        return MSG
    return "orders"


@pytest.mark.parametrize(
    ("method", "template"),
    [pytest.param(m, t, id=f"{m} {t}") for m, t in NAME_PATHS + ID_PATHS],
)
def test_a_well_formed_path_parameter_reaches_the_routes_view(
    api: APIClient, world: Callable[[], None], method: str, template: str
) -> None:
    """The positive control of the hostile-path cases: any unknown path is a JSON 404 too, so
    those would pass with the route deleted. A well-formed value must reach the route's view:
    whatever it answers (even its own 404), it is not the router's."""
    payload = {**GOOD, "check_url": "http://127.0.0.1:9/", "receipt_handles": ["1.a"]}
    response = send_json(api, method, template.format(well_formed(template)), payload)
    assert response.status_code != 405, response.content[:300]
    if response.status_code == 404:
        assert response.json()["error"]["message"] != "No such API endpoint.", template


@pytest.mark.parametrize(
    "path",
    [
        "/console/producer-groups/%00/edit/",
        "/console/producer-groups/a%0A/rotate-secret/",
        "/console/producer-groups/%ED%A0%80/test-callback/",
        "/console/consumer-groups/%00/",
        "/console/consumer-groups/billing/dlq/%00/resend/",
        "/console/tokens/99999999999999999999/revoke/",
        "/console/reconciliations/99999999999999999999/",
    ],
)
def test_a_hostile_console_path_is_a_404(world: Callable[[], None], path: str) -> None:
    client = login("superuser", "sue")
    assert client.get(path).status_code == 404
    assert client.post(path, {"reason": "x", "confirm": "on"}).status_code == 404
    world()


# Query parameters ------------------------------------------------------------------------------

BAD_NUMBERS = {
    "20 digits": "99999999999999999999",
    "5000 digits": "9" * 5000,
    "above MAX_INT": str(2**31),
    "negative": "-1",
    "superscript two": "²",
    "fullwidth one": "１",
    "underscore": "1_0",
    "float": "1.5",
    "exponent": "1e3",
    "NUL": "\x00",
    "empty": "",
    "space": " 1",
}


LISTS = ["/api/v1/transactions", "/api/v1/consumer-groups/billing/dlq", "/api/v1/reconciliations"]
NUMBER_PARAMS = [(path, param) for path in LISTS for param in ("page", "page_size")]
NUMBER_PARAMS.append(("/api/v1/transactions", "older_than_seconds"))


@pytest.mark.parametrize("what", BAD_NUMBERS)
@pytest.mark.parametrize(("path", "param"), NUMBER_PARAMS)
def test_a_hostile_number_in_a_list_query_is_400(
    api: APIClient, world: Callable[[], None], path: str, param: str, what: str
) -> None:
    response = api.get(path, {param: BAD_NUMBERS[what]})
    error = assert_error(response, 400, "invalid_request", shorter_than=ERROR_SIZE)
    assert param in error["details"], error
    world()


@pytest.mark.parametrize("query", ["=", "=1", "pgae=2", "%00=1", "page=1&extra="])
@pytest.mark.parametrize("path", LISTS)
def test_an_unknown_or_nameless_list_query_parameter_is_400(
    api: APIClient, world: Callable[[], None], path: str, query: str
) -> None:
    """Unknown query parameters are refused like unknown body fields (a typo is an error), a
    nameless one (`?=`, found by the fuzzer) included."""
    assert_error(api.get(f"{path}?{query}"), 400, "invalid_request", shorter_than=ERROR_SIZE)
    assert api.get(f"{path}?page=1").status_code == 200  # the positive control
    world()


@pytest.mark.parametrize(
    "value", ["%00", "a%0A", "%ED%A0%80", "g" * 128, "x" * 100_000], ids=lambda v: v[:12]
)
@pytest.mark.parametrize("param", ["producer_group", "state"])
def test_a_hostile_string_in_the_transaction_list_query_is_400(
    api: APIClient, world: Callable[[], None], param: str, value: str
) -> None:
    response = api.get(f"/api/v1/transactions?{param}={value}")
    error = assert_error(response, 400, "invalid_request", shorter_than=ERROR_SIZE)
    assert param in error["details"], error
    world()


@pytest.mark.parametrize("what", BAD_NUMBERS)
@pytest.mark.parametrize("field", ["older_than_seconds", "min_check_times", "page"])
def test_a_hostile_number_in_the_console_filter_is_never_a_server_error(
    world: Callable[[], None], field: str, what: str
) -> None:
    response = login("txhub-viewers", "vera").get(
        "/console/transactions/", {field: BAD_NUMBERS[what]}
    )
    # A form error on the page; a NUL, which no query could carry, is refused before the form
    # (apps/console/unstorable.py).
    assert response.status_code == (400 if what == "NUL" else 200)
    world()


# JSON fields -----------------------------------------------------------------------------------

NUL, SURROGATE = "a\x00b", "a\ud800b"
STRINGS = {"NUL": NUL, "lone surrogate": SURROGATE, "low surrogate": "\udfff"}
NAMES = {**STRINGS, "trailing newline": "orders\n", "overlong": "g" * 128, "superscript": "²"}
INTS = {
    "2^63": 2**63,
    "2^64": 2**64,
    "10^30": 10**30,
    "-2^63-1": -(2**63) - 1,
    "float": 1.5,
    "bool": True,
    "string": "4",
}
URLS = {
    **STRINGS,
    "port 99999": "http://127.0.0.1:99999/check",
    "port 0": "http://127.0.0.1:0/check",
    "bad IPv6": "http://[::1/check",
    "no host": "http:///check",
    "ftp": "ftp://127.0.0.1/check",
    "overlong label": "http://" + "a" * 64 + ".example.com/",
    "unicode digit port": "http://127.0.0.1:²/",
}

# (method, path, good payload, field, the value's place: (field,), (field, 0), (field, "k"))
Field = tuple[str, str, dict[str, Any], tuple[Any, ...]]
MESSAGE_FIELDS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("producer_group", ("producer_group",), NAMES),
    ("body", ("body",), STRINGS),
    ("tags", ("tags",), STRINGS),
    ("keys item", ("keys", 0), STRINGS),
    ("property value", ("properties", "k"), STRINGS),
    ("property key", ("properties", None), STRINGS),
    ("deliver_at", ("deliver_at",), STRINGS),
    ("delay_level", ("delay_level",), INTS),
    (
        "message_group",
        ("message_group",),
        {**STRINGS, "blank": " ", "control": "a\x1fb", "overlong": "g" * 129, "number": 7},
    ),
]
OTHER_FIELDS: list[tuple[str, str, str, dict[str, Any], tuple[Any, ...], dict[str, Any]]] = [
    ("prepare topic", "POST", "/api/v1/transactions", TX, ("topic",), NAMES),
    ("prepare immunity", "POST", "/api/v1/transactions", TX, ("check_immunity_seconds",), INTS),
    ("topic name", "POST", "/api/v1/topics", {"name": "t"}, ("name",), NAMES),
    ("topic queues", "POST", "/api/v1/topics", {"name": "t"}, ("queues",), INTS),
    (
        "group name",
        "POST",
        "/api/v1/producer-groups",
        {"name": "p", "check_url": "http://127.0.0.1:9/"},
        ("name",),
        NAMES,
    ),
    (
        "check_url",
        "POST",
        "/api/v1/producer-groups",
        {"name": "p", "check_url": "http://127.0.0.1:9/"},
        ("check_url",),
        URLS,
    ),
    (
        "patched check_url",
        "PATCH",
        "/api/v1/producer-groups/order-service",
        {"check_url": "http://127.0.0.1:9/"},
        ("check_url",),
        URLS,
    ),
    ("consumer name", "POST", "/api/v1/consumer-groups", {"name": "c"}, ("name",), NAMES),
    (
        "max_delivery_attempts",
        "POST",
        "/api/v1/consumer-groups",
        {"name": "c"},
        ("max_delivery_attempts",),
        INTS,
    ),
    (
        "consume_from",
        "POST",
        "/api/v1/consumer-groups",
        {"name": "c"},
        ("consume_from",),
        STRINGS,
    ),
    (
        "fifo",
        "POST",
        "/api/v1/consumer-groups",
        {"name": "c"},
        ("fifo",),
        {"string": "true", "one": 1, "null": None, "list": [True]},
    ),
    (
        "token name",
        "POST",
        "/api/v1/tokens",
        {"name": "t", "scopes": ["admin"]},
        ("name",),
        STRINGS,
    ),
    (
        "token scope",
        "POST",
        "/api/v1/tokens",
        {"name": "t", "scopes": ["admin"]},
        ("scopes", 0),
        NAMES,
    ),
    (
        "receive topic",
        "POST",
        "/api/v1/consumer-groups/billing/receive",
        {"topic": "orders"},
        ("topic",),
        NAMES,
    ),
    (
        "tag_expression",
        "POST",
        "/api/v1/consumer-groups/billing/receive",
        {"topic": "orders"},
        ("tag_expression",),
        STRINGS,
    ),
    *[
        (
            f"receive {name}",
            "POST",
            "/api/v1/consumer-groups/billing/receive",
            {"topic": "orders"},
            (name,),
            INTS,
        )
        for name in ("max_messages", "invisible_seconds", "wait_seconds")
    ],
    (
        "change-invisible handle",
        "POST",
        "/api/v1/consumer-groups/billing/change-invisible",
        {"receipt_handle": "1.a", "invisible_seconds": 60},
        ("receipt_handle",),
        STRINGS,
    ),
    (
        "change-invisible seconds",
        "POST",
        "/api/v1/consumer-groups/billing/change-invisible",
        {"receipt_handle": "1.a", "invisible_seconds": 60},
        ("invisible_seconds",),
        INTS,
    ),
    (
        "ack handle",
        "POST",
        "/api/v1/consumer-groups/billing/ack",
        {"receipt_handles": ["1.a"]},
        ("receipt_handles", 0),
        STRINGS,
    ),
    *[
        (
            f"{action} reason",
            "POST",
            f"/api/v1/transactions/{uuid.UUID(int=1)}/{action}",
            {"reason": "r"},
            ("reason",),
            STRINGS,
        )
        for action in ("commit", "rollback", "resume")
    ],
]


def placed(good: dict[str, Any], place: tuple[Any, ...], value: Any) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(json.dumps(good))
    if len(place) == 1:
        payload[place[0]] = value
    elif place[1] is None:  # a dict key
        payload[place[0]] = {value: "v"} if isinstance(value, str) else {"k": value}
    elif isinstance(place[1], int):
        payload[place[0]] = [value]
    else:
        payload[place[0]] = {place[1]: value}
    return payload


FIELD_CASES = [
    pytest.param(
        path, {"method": "POST", **GOOD, **extra}, place, value, id=f"{path} {label} {what}"
    )
    for path, extra in (("/api/v1/topics/orders/messages", {}), ("/api/v1/transactions", TX))
    for label, place, table in MESSAGE_FIELDS
    for what, value in table.items()
    if not (label == "property key" and not isinstance(value, str))
] + [
    pytest.param(path, {"method": method, **good}, place, value, id=f"{label} {what}")
    for label, method, path, good, place, table in OTHER_FIELDS
    for what, value in table.items()
]


@pytest.mark.parametrize(("path", "good", "place", "value"), FIELD_CASES)
def test_a_hostile_json_value_is_400_naming_its_field_and_stores_nothing(
    api: APIClient,
    world: Callable[[], None],
    path: str,
    good: dict[str, Any],
    place: tuple[Any, ...],
    value: Any,
) -> None:
    good = dict(good)
    method = good.pop("method")
    response = send_json(api, method, path, placed(good, place, value))
    error = assert_error(response, 400, "invalid_request", shorter_than=ERROR_SIZE)
    assert place[0] in error["details"], error
    world()


def test_every_field_table_covers_every_string_and_integer_input() -> None:
    """The tables above name every input field of every input serializer."""
    from apps.broker.api import serializers as inputs

    covered = {place[0] for _, place, _ in MESSAGE_FIELDS}
    covered |= {place[0] for *_, place, _ in OTHER_FIELDS}
    skipped = {"body_base64", "page", "page_size", "older_than_seconds", "state"}
    for serializer in (
        inputs.TransactionIn,
        inputs.TopicIn,
        inputs.ProducerGroupIn,
        inputs.ConsumerGroupIn,
        inputs.TokenIn,
        inputs.ReceiveIn,
        inputs.AckIn,
        inputs.ChangeInvisibleIn,
        inputs.ReasonIn,
    ):
        missing = set(serializer().fields) - covered - skipped
        assert not missing, (serializer.__name__, missing)


# Raw bodies ------------------------------------------------------------------------------------

RAW_BODIES = {
    "nested 100,000 deep": '{"producer_group": "order-service", "body": "x", "properties": '
    + "[" * 100_000
    + "]" * 100_000
    + "}",
    "nested objects": '{"a":' * 50_000 + "1" + "}" * 50_000,
    "a list": "[1, 2]",
    "a number": "42",
    "a string": '"hello"',
    "null": "null",
    "true": "true",
    "not UTF-8": b'{"producer_group": "order-service", "body": "\xff\xfe"}',
    "a BOM and UTF-16": '{"body": "x"}'.encode("utf-16"),
    "NaN": '{"producer_group": "order-service", "body": "x", "delay_level": NaN}',
    "Infinity": '{"producer_group": "order-service", "body": "x", "delay_level": 1e400}',
    "10^5000": '{"producer_group": "order-service", "body": "x", "delay_level": 1' + "0" * 5000,
    "truncated": '{"producer_group": "order-',
}
BODY_PATHS = [
    "/api/v1/topics/orders/messages",
    "/api/v1/transactions",
    "/api/v1/topics",
    "/api/v1/consumer-groups/billing/receive",
    "/api/v1/consumer-groups/billing/ack",
    f"/api/v1/transactions/{uuid.UUID(int=1)}/commit",
]


@pytest.mark.parametrize("what", RAW_BODIES)
@pytest.mark.parametrize("path", BODY_PATHS)
def test_a_body_that_is_not_a_json_object_is_400_everywhere(
    api: APIClient, world: Callable[[], None], path: str, what: str
) -> None:
    response = send_json(api, "POST", path, RAW_BODIES[what])
    assert_error(response, 400, "invalid_request", shorter_than=ERROR_SIZE)
    world()


def test_an_unknown_charset_is_400(api: APIClient, world: Callable[[], None]) -> None:
    for charset in ("bz2_codec", "rot13", "utf-32"):
        response = api.generic(
            "POST",
            "/api/v1/topics/orders/messages",
            json.dumps(GOOD),
            content_type=f"application/json; charset={charset}",
        )
        assert_error(response, 400, "invalid_request", shorter_than=ERROR_SIZE)
    world()


# Receipt handles -------------------------------------------------------------------------------

BAD_HANDLES = [
    "².abc",
    "١.abc",  # an Arabic-Indic digit: isdigit() and int() both take it
    "１.abc",
    "99999999999999999999.abc",
    "9223372036854775808.abc",  # 2^63
    "-1.abc",
    "1.",
    ".abc",
    "1.ABC",
    "1.abc\n",
    " 1.abc",
    "1_0.abc",
    "1.abc.def",
]


def test_hostile_receipt_handles_are_invalid_never_an_error(
    api: APIClient, world: Callable[[], None]
) -> None:
    response = api.post(
        "/api/v1/consumer-groups/billing/ack", {"receipt_handles": BAD_HANDLES}, format="json"
    )
    assert response.status_code == 200, response.content[:300]
    assert response.json() == {"acked": [], "invalid": BAD_HANDLES}
    for handle in BAD_HANDLES:
        response = api.post(
            "/api/v1/consumer-groups/billing/change-invisible",
            {"receipt_handle": handle, "invisible_seconds": 60},
            format="json",
        )
        assert (
            "receipt_handle"
            in assert_error(response, 400, "invalid_request", shorter_than=ERROR_SIZE)["details"]
        )
    world()


# Times -----------------------------------------------------------------------------------------


def _far_past() -> str:
    return (timezone.now() - timedelta(days=4)).isoformat()


BAD_TIMES: dict[str, str | Callable[[], str]] = {
    "year 1 with an offset": "0001-01-01T00:00:00+01:00",
    "year 1 UTC": "0001-01-01T00:00:00+00:00",
    "year 9999 minus an offset": "9999-12-31T23:59:59-23:59",
    "year 9999": "9999-12-31T23:59:59+00:00",
    "four days ago": _far_past,
    "1970": "1970-01-01T00:00:00Z",
}


@pytest.mark.parametrize("what", BAD_TIMES)
@pytest.mark.parametrize("path", ["/api/v1/topics/orders/messages", "/api/v1/transactions"])
def test_a_delivery_time_outside_max_delay_either_way_is_400(
    api: APIClient, world: Callable[[], None], path: str, what: str
) -> None:
    value = BAD_TIMES[what]
    when = value() if callable(value) else value
    message = TX if path.endswith("transactions") else GOOD
    response = api.post(path, {**message, "deliver_at": when}, format="json")
    assert (
        "deliver_at"
        in assert_error(response, 400, "invalid_request", shorter_than=ERROR_SIZE)["details"]
    )
    world()


def test_a_delivery_time_is_stored_in_utc(api: APIClient, setup_topic: Any) -> None:
    setup_topic()
    when = (timezone.now() + timedelta(hours=1)).astimezone(timezone.get_fixed_timezone(-600))
    response = api.post("/api/v1/transactions", {**TX, "deliver_at": when.isoformat()}, "json")
    assert response.status_code == 201
    from apps.broker.models import HalfMessage

    stored = HalfMessage.objects.get().deliver_at
    assert stored is not None
    assert stored == when


# Resource consumption (OWASP API4) -------------------------------------------------------------

MILLION = 1_000_000
HUGE: list[tuple[str, str, dict[str, Any]]] = [
    ("keys", "/api/v1/topics/orders/messages", {**GOOD, "keys": ["a"] * MILLION}),
    ("keys", "/api/v1/topics/orders/messages", {**GOOD, "keys": [1] * MILLION}),
    ("keys", "/api/v1/transactions", {**TX, "keys": [None] * MILLION}),
    (
        "properties",
        "/api/v1/topics/orders/messages",
        {**GOOD, "properties": {f"{i:x}": 1 for i in range(MILLION // 2)}},
    ),
    (
        "receipt_handles",
        "/api/v1/consumer-groups/billing/ack",
        {"receipt_handles": ["x"] * MILLION},
    ),
    ("scopes", "/api/v1/tokens", {"name": "t", "scopes": [1] * MILLION}),
    (
        "unknown",
        "/api/v1/topics/orders/messages",
        {**GOOD, **{f"u{i:x}": 1 for i in range(MILLION // 2)}},
    ),
]


@pytest.mark.parametrize(("field", "path", "payload"), HUGE, ids=[f"{h[0]}-{h[1]}" for h in HUGE])
def test_a_million_element_input_is_refused_with_a_small_answer(
    api: APIClient, world: Callable[[], None], field: str, path: str, payload: dict[str, Any]
) -> None:
    response = send_json(api, "POST", path, payload)
    error = assert_error(response, 400, "invalid_request", shorter_than=ERROR_SIZE)
    assert len(response.content) < 2048
    if field != "unknown":
        assert field in error["details"]
    world()


def test_an_error_body_is_bounded_and_encodable(api: APIClient, world: Callable[[], None]) -> None:
    # A refused choice is echoed in the answer: a megabyte of it, with a lone surrogate.
    payload = {"name": "c", "consume_from": "\ud800" + "x" * MILLION}
    response = send_json(api, "POST", "/api/v1/consumer-groups", payload)
    assert (
        "consume_from"
        in assert_error(response, 400, "invalid_request", shorter_than=ERROR_SIZE)["details"]
    )
    assert len(response.content) < 2048
    world()


def test_a_large_body_from_a_token_without_the_scope_is_403_before_it_is_read(
    make_client: Callable[..., APIClient], setup_topic: Callable[..., Any]
) -> None:
    setup_topic()
    other = make_client("consume:someone-else", "produce:someone-else")
    consumer = make_client("consume:billing")
    before = table_counts()
    big_ack = {"receipt_handles": [1] * 100_000}
    response = send_json(other, "POST", "/api/v1/consumer-groups/billing/ack", big_ack)
    assert_error(response, 403, "forbidden", shorter_than=ERROR_SIZE)
    response = send_json(consumer, "POST", "/api/v1/topics/orders/messages", {"keys": [1] * 50_000})
    assert_error(response, 403, "forbidden", shorter_than=ERROR_SIZE)
    # Normal-sized bad input keeps the documented order: 400 before 403.
    response = send_json(other, "POST", "/api/v1/consumer-groups/billing/ack", {"x": 1})
    assert_error(response, 400, "invalid_request", shorter_than=ERROR_SIZE)
    assert table_counts() == before


CONSOLE_WRITES = [
    ("/console/producer-groups/new/", {"name": "p", "check_url": "{}"}),
    ("/console/producer-groups/order-service/edit/", {"check_url": "{}"}),
]


@pytest.mark.parametrize("what", [w for w in URLS if w not in STRINGS])
@pytest.mark.parametrize(("path", "form"), CONSOLE_WRITES)
def test_a_hostile_check_url_in_the_console_is_a_form_error(
    world: Callable[[], None], path: str, form: dict[str, str], what: str
) -> None:
    data = {key: value.replace("{}", URLS[what]) for key, value in form.items()}
    response = login("txhub-operators", "otto").post(path, data)
    assert response.status_code == 200
    assert 'class="errorlist' in response.content.decode()
    world()


# (The console's forms strip surrounding whitespace, as Django's do: "orders\n" is "orders".)
@pytest.mark.parametrize("name", ["a b", "g" * 128, "a\x00b", "²", "a\nb"])
def test_a_hostile_name_in_the_console_is_a_form_error(
    world: Callable[[], None], name: str
) -> None:
    otto = login("txhub-operators", "otto")
    for path, data in (
        ("/console/topics/new/", {"name": name, "queues": "2"}),
        ("/console/consumer-groups/new/", {"name": name, "max_delivery_attempts": "3"}),
        ("/console/producer-groups/new/", {"name": name, "check_url": "http://127.0.0.1:9/"}),
    ):
        response = otto.post(path, {**data, "consume_from": "first"})
        assert response.status_code == 200, path
        assert 'class="errorlist' in response.content.decode(), path
    world()
