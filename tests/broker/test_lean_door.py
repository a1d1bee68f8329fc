"""The lean door (apps/broker/api/lean.py, decision 0027) answers exactly as Django does.

Two real web servers on the test database, started as `make run` starts them: one with the lean
door (the default), one with TXHUB_LEAN_DOOR=0 (Django answers everything). Every request of the
table below goes to both; their answers must agree: status, every header but the date, and the
body (ids and times, which differ between two stores, compared by shape). The lean server's
`txhub_lean_door_answers_total` shows which requests the lean door took: the plain ones, and
none of the others.

Every server test runs twice: with the local defaults, and with the production
settings behind a TLS proxy (SSL redirect, HSTS, the proxy's `X-Forwarded-Proto`), where each
request carries the header the proxy would set.
"""

import http.client
import json
import re
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from apps.broker.api import lean
from apps.broker.services import registry
from tests.conftest import ROOT, db_url_for_tests, start_gunicorn
from tests.support import workers
from tests.support.listening import database_now, hub_listening
from tests.support.metrics import METRICS_HEADERS
from tests.support.ports import free_port
from tests.support.production import BEHIND_A_TLS_PROXY

PREFIX = "/api/v1"


# The production settings (docs/operations.md) that change an answer (decision 0041).
PRODUCTION = BEHIND_A_TLS_PROXY
# What the TLS proxy in front adds to every request it forwards, by deployment.
PROXY_HEADERS = {"local": {}, "production": {"X-Forwarded-Proto": "https"}}


@dataclass(frozen=True)
class Door:
    port: int
    proxy: dict[str, str]  # the headers the deployment's proxy adds

    def call(
        self, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        raw = (
            body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
        )
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request("POST", path, raw, {**self.proxy, **(headers or {})})
            response = connection.getresponse()
            answer = response.read()
            got = {name.lower(): value for name, value in response.getheaders()}
            return response.status, got, answer
        finally:
            connection.close()

    def lean_answers(self) -> float:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        connection.request("GET", "/metrics", headers=METRICS_HEADERS)
        text = connection.getresponse().read().decode()
        connection.close()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("txhub_lean_door_answers_total")
        )


def _start(lean_door: bool, deployment: str, **extra: str) -> Iterator[Door]:
    port = free_port()
    name = f"{'lean' if lean_door else 'django'}-{deployment}"
    env = {
        **extra,
        "TXHUB_LEAN_DOOR": "1" if lean_door else "0",
        # Named, so the wake-up test can see its LISTEN connection wait; and no fallback check
        # within a test's time, so a woken receive was woken by the NOTIFY.
        "DATABASE_URL": f"{db_url_for_tests()}?application_name=lean-test-{name}",
        "TXHUB_LONG_POLL_FALLBACK": "60",
    }
    if deployment == "production":
        env.update(PRODUCTION)
    with open(workers.log_path(f"test-gunicorn-{name}.log"), "w") as log:
        # One worker each: /metrics then reads the one process that answered.
        process = start_gunicorn(port, workers=1, log=log, extra_env=env)
        yield Door(port, PROXY_HEADERS.get(deployment, {}))
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


@pytest.fixture(scope="module", params=["local", "production"])
def deployment(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def lean_server(django_db_setup: None, deployment: str) -> Iterator[Door]:
    yield from _start(True, deployment)


@pytest.fixture(scope="module")
def django_server(django_db_setup: None, deployment: str) -> Iterator[Door]:
    yield from _start(False, deployment)


@pytest.fixture
def world(transactional_db: None, setup_topic: Any) -> dict[str, str]:
    setup_topic(topic="lean", producer="lean-p", consumer="lean-c")
    setup_topic(topic="other", producer="other-p", consumer="other-c")
    tokens = {}
    for name, scopes in {
        "admin": ["admin"],
        "producer": ["produce:lean-p"],
        "stranger": ["produce:other-p", "consume:other-c"],
        "consumer": ["consume:lean-c"],
    }.items():
        tokens[name] = registry.token_create(name=f"lean-{name}", scopes=scopes)[1]
    revoked, raw = registry.token_create(name="lean-revoked", scopes=["admin"])
    registry.token_revoke(token_id=revoked.pk)
    tokens["revoked"] = raw
    return tokens


def headers_for(token: str | None, **extra: str) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    headers.update(extra)
    return headers


_VARYING = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"  # transaction ids, handles
    r"|\b[0-9A-F]{32}\b"  # msg ids
    r"|\b\d+\.[0-9a-f]{16,}\b"  # receipt handles
    r"|\d{4}-\d\d-\d\dT[0-9:.]+(Z|[+-]\d\d:\d\d)?"  # times
)


# The only numbers that differ between the two doors' answers: both store in one database, so
# the second door's message takes the next offset, and a queue follows the message id's hash.
_PLACED = frozenset({"queue_id", "queue_offset"})


def shape(body: bytes) -> Any:
    """The answer with what differs between two stores (ids, times) blanked."""
    if not body:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return body  # Django's own pages (a refused Host): compared as they are

    def blank(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {name: blank(item, name) for name, item in value.items()}
        if isinstance(value, list):
            return [blank(item, key) for item in value]
        if isinstance(value, str):
            return _VARYING.sub("<id>", value)
        if key in _PLACED and isinstance(value, int) and not isinstance(value, bool):
            return "<int>"  # where a message went: a queue by its id's hash, the next offset
        return value  # every other number (counts, attempts, states' numbers) must agree

    return blank(data)


def test_shape_blanks_only_where_a_message_went() -> None:
    body = b'{"queue_id": 1, "queue_offset": 7, "delivery_attempt": 2, "acked": [3]}'
    assert shape(body) == {
        "queue_id": "<int>",
        "queue_offset": "<int>",
        "delivery_attempt": 2,
        "acked": [3],
    }
    assert shape(b'{"delivery_attempt": 1}') != shape(b'{"delivery_attempt": 2}')


def comparable(status: int, headers: dict[str, str], body: bytes) -> tuple[Any, ...]:
    kept = {k: v for k, v in headers.items() if k not in {"date", "content-length"}}
    if "set-cookie" in kept:  # a new CSRF token is random, and so is its expiry's second
        cookie = re.sub(r"^([^=]+)=[^;]*", r"\1=<value>", kept["set-cookie"])
        kept["set-cookie"] = re.sub(r"expires=[^;]+", "expires=<time>", cookie)
    return status, kept, shape(body)


def both(
    lean_server: Door, django_server: Door, path: str, body: Any, headers: dict[str, str]
) -> tuple[tuple[Any, ...], bool]:
    """The two doors' answers, asserted equal; and whether the lean door took the request."""
    before = lean_server.lean_answers()
    lean_answer = lean_server.call(path, body, headers)
    took = lean_server.lean_answers() > before
    django_answer = django_server.call(path, body, headers)
    assert comparable(*lean_answer) == comparable(*django_answer), (path, body, headers)
    return comparable(*lean_answer), took


def test_plain_requests_are_answered_by_the_lean_door_exactly_as_by_django(
    world: dict[str, str], lean_server: Door, django_server: Door
) -> None:
    admin, producer, consumer = world["admin"], world["producer"], world["consumer"]
    unknown_id = str(uuid.uuid4())
    message = {"topic": "lean", "producer_group": "lean-p", "body": "hello"}
    plain: list[tuple[str, Any, dict[str, str], int]] = [
        # (path, body, headers, expected status): every one taken by the lean door
        (f"{PREFIX}/transactions", message, headers_for(producer), 201),
        (f"{PREFIX}/transactions", message, headers_for(world["revoked"]), 401),
        (f"{PREFIX}/transactions", message, headers_for("not-a-token"), 401),
        (f"{PREFIX}/transactions", {"topic": "lean"}, headers_for(producer), 400),
        (f"{PREFIX}/transactions", {**message, "extra": 1}, headers_for(producer), 400),
        (f"{PREFIX}/transactions", {**message, "topic": 5}, headers_for(producer), 400),
        (f"{PREFIX}/transactions", {**message, "delay_level": 99}, headers_for(producer), 400),
        (f"{PREFIX}/transactions", {**message, "body": "\ud800"}, headers_for(producer), 400),
        (f"{PREFIX}/transactions", message, headers_for(world["stranger"]), 403),
        (f"{PREFIX}/transactions", {**message, "topic": "nope"}, headers_for(producer), 404),
        (f"{PREFIX}/transactions/{unknown_id}/commit", {}, headers_for(producer), 404),
        (f"{PREFIX}/transactions/{unknown_id}/rollback", None, headers_for(producer), 404),
        (f"{PREFIX}/transactions/{unknown_id}/commit", {"reason": 5}, headers_for(producer), 400),
        (
            f"{PREFIX}/topics/lean/messages",
            {"producer_group": "lean-p", "body": "x"},
            headers_for(producer),
            201,
        ),
        (
            f"{PREFIX}/topics/lean/messages",
            {"producer_group": "lean-p"},
            headers_for(producer),
            400,
        ),
        (
            f"{PREFIX}/topics/nope/messages",
            {"producer_group": "lean-p", "body": "x"},
            headers_for(producer),
            404,
        ),
        (
            f"{PREFIX}/topics/lean/messages",
            {"producer_group": "lean-p", "body": "x"},
            headers_for(consumer),
            403,
        ),
        (
            f"{PREFIX}/topics/lean/messages",
            {"producer_group": "lean-p", "body": "x", "message_group": "order-9527"},
            headers_for(producer),
            201,
        ),
        (
            f"{PREFIX}/topics/lean/messages",
            {"producer_group": "lean-p", "body": "x", "message_group": "g", "delay_level": 2},
            headers_for(producer),
            400,
        ),
        (
            f"{PREFIX}/transactions",
            {**message, "message_group": "order-9527"},
            headers_for(producer),
            201,
        ),
        (f"{PREFIX}/transactions", {**message, "message_group": " "}, headers_for(producer), 400),
        (
            f"{PREFIX}/topics/lean/messages:batch",
            {"producer_group": "lean-p", "messages": [{"body": "a"}, {"body": "b"}]},
            headers_for(producer),
            201,
        ),
        (
            f"{PREFIX}/topics/lean/messages:batch",
            {"producer_group": "lean-p", "messages": [{"body": "a"}] * 65},
            headers_for(producer),
            400,
        ),
        (
            f"{PREFIX}/transactions:batch",
            {"producer_group": "lean-p", "topic": "lean", "messages": [{"body": "a"}, {"x": 1}]},
            headers_for(producer),
            400,
        ),
        (
            f"{PREFIX}/transactions:commit",
            {"transaction_ids": [unknown_id]},
            headers_for(producer),
            200,
        ),
        (f"{PREFIX}/transactions:rollback", {"transaction_ids": "no"}, headers_for(producer), 400),
        (
            f"{PREFIX}/consumer-groups/lean-c/receive",
            {"topic": "other"},
            headers_for(consumer),
            200,
        ),
        (
            f"{PREFIX}/consumer-groups/lean-c/receive",
            {"topic": "lean", "max_messages": 0},
            headers_for(consumer),
            400,
        ),
        (f"{PREFIX}/consumer-groups/lean-c/receive", {"topic": "nope"}, headers_for(admin), 404),
        (
            f"{PREFIX}/consumer-groups/other-c/receive",
            {"topic": "lean"},
            headers_for(consumer),
            403,
        ),
        (
            f"{PREFIX}/consumer-groups/lean-c/ack",
            {"receipt_handles": ["x"]},
            headers_for(consumer),
            200,
        ),
        (
            f"{PREFIX}/consumer-groups/lean-c/ack",
            {"receipt_handles": "x"},
            headers_for(consumer),
            400,
        ),
        (f"{PREFIX}/transactions", message, headers_for(producer, Accept="application/json"), 201),
        (
            f"{PREFIX}/transactions",
            message,
            headers_for(producer, **{"Content-Type": "application/json; charset=utf-8"}),
            201,
        ),
    ]
    for path, body, headers, expected in plain:
        (status, _, _), took = both(lean_server, django_server, path, body, headers)
        assert status == expected, (path, body, status)
        assert took, f"the lean door did not take {path} {body}"

    not_plain: list[tuple[str, Any, dict[str, str], int]] = [
        # Django answers these (the lean door returns before doing anything)
        (f"{PREFIX}/transactions", message, headers_for(None), 401),
        (f"{PREFIX}/transactions", b"{not json", headers_for(producer), 400),
        (f"{PREFIX}/transactions", b"[1, 2]", headers_for(producer), 400),
        (f"{PREFIX}/transactions", b'{"topic": NaN}', headers_for(producer), 400),
        (f"{PREFIX}/transactions", b"[" * 100_000, headers_for(producer), 400),
        # A key given twice: the parser's 400 naming it, as for any body it refuses.
        (
            f"{PREFIX}/transactions",
            b'{"topic": "lean", "topic": "other", "producer_group": "lean-p", "body": "x"}',
            headers_for(producer),
            400,
        ),
        (f"{PREFIX}/transactions?" + "&".join(["a=1"] * 1001), message, headers_for(producer), 400),
        (
            f"{PREFIX}/transactions",
            message,
            headers_for(producer, **{"Content-Type": "text/plain"}),
            415,
        ),
        (f"{PREFIX}/transactions", message, headers_for(producer, Accept="text/html"), 406),
        (f"{PREFIX}/transactions?x=1", message, headers_for(producer), 201),
        (f"{PREFIX}/transactions/", message, headers_for(producer), 404),
        (f"{PREFIX}/transactions", message, headers_for(producer, Host="evil.example"), 400),
        (f"{PREFIX}/transactions", {**message, "body": "x" * 70_000}, headers_for(producer), 201),
        (
            f"{PREFIX}/transactions",
            message,
            headers_for(None, Authorization=f"Token {producer}"),
            401,
        ),
        # Sessions and CSRF answer a malformed cookie with cookies of their own.
        (f"{PREFIX}/transactions", message, headers_for(producer, Cookie="sessionid=x"), 201),
        (f"{PREFIX}/transactions", message, headers_for(producer, Cookie="csrftoken=bad"), 201),
    ]
    for path, body, headers, expected in not_plain:
        (status, _, _), took = both(lean_server, django_server, path, body, headers)
        assert status == expected, (path, status)
        assert not took, f"the lean door took {path} {headers}"


def test_a_bearer_token_is_read_whole_at_both_doors(
    world: dict[str, str], lean_server: Door, django_server: Door
) -> None:
    """The scheme's case is not the token's (RFC 9110), but every character of the token is,
    and nothing may follow it (decision 0108). The two doors answer alike; the lean door takes
    each request but the malformed header, which the web tier refuses before any door."""
    producer = world["producer"]
    message = {"topic": "lean", "producer_group": "lean-p", "body": "hello"}
    last = "A" if producer[-1] != "A" else "B"
    cases = {
        "Bearer": (f"Bearer {producer}", 201),
        "lower-case scheme": (f"bearer {producer}", 201),
        "upper-case scheme": (f"BEARER {producer}", 201),
        "last character changed": (f"Bearer {producer[:-1]}{last}", 401),
        "one character more": (f"Bearer {producer}A", 401),
        "one character less": (f"Bearer {producer[:-1]}", 401),
        "a word after the token": (f"Bearer {producer} {producer}", 401),
    }
    outcomes = {}
    for name, (authorization, _) in cases.items():
        headers = headers_for(None, Authorization=authorization)
        (status, _, _), took = both(
            lean_server, django_server, f"{PREFIX}/transactions", message, headers
        )
        assert took is (name != "a word after the token"), name
        outcomes[name] = status
    assert outcomes == {name: status for name, (_, status) in cases.items()}


def test_secure_answers_carry_hsts_and_plain_http_is_redirected_by_django(
    world: dict[str, str], lean_server: Door, django_server: Door, deployment: str
) -> None:
    """Under the production settings the lean door takes what the proxy marked secure and adds
    SecurityMiddleware's HSTS header; a request it did not mark secure is Django's redirect."""
    path = f"{PREFIX}/topics/lean/messages"
    message = {"producer_group": "lean-p", "body": "secure"}
    (status, headers, _), took = both(
        lean_server, django_server, path, message, headers_for(world["producer"])
    )
    assert (status, took) == (201, True)
    if deployment == "local":
        assert "strict-transport-security" not in headers
        return
    assert headers["strict-transport-security"] == "max-age=31536000; includeSubDomains; preload"
    no_proxy = (Door(lean_server.port, {}), Door(django_server.port, {}))
    for doors, extra, expected in (
        ((lean_server, django_server), {"X-Forwarded-Proto": "http"}, 301),
        (no_proxy, {}, 301),
        # Django's META drops a header with an underscore (it could pass for its dashed twin):
        # not secure, and the lean door leaves such a request to Django.
        (no_proxy, {"X_Forwarded_Proto": "https"}, 301),
    ):
        # One Host for both servers, so that Django's redirects name the same place.
        same_host = headers_for(world["producer"], Host="localhost", **extra)
        (status, headers, _), took = both(*doors, path, message, same_host)
        assert (status, took) == (expected, False), extra
        if expected == 301:
            assert headers["location"] == f"https://localhost{path}"


def test_a_transaction_through_the_lean_door_matches_django_step_by_step(
    world: dict[str, str], lean_server: Door, django_server: Door
) -> None:
    """Prepare, commit, commit again (200), roll back (409), receive, ack, ack again; an
    idempotent retry."""
    producer, consumer = world["producer"], world["consumer"]
    answers = []
    for door in (lean_server, django_server):
        steps = []
        status, _, body = door.call(
            f"{PREFIX}/transactions",
            {"topic": "lean", "producer_group": "lean-p", "body": "step"},
            headers_for(producer),
        )
        tx = json.loads(body)["transaction_id"]
        steps.append(comparable(status, _, body))
        for outcome in ("commit", "commit", "rollback"):
            steps.append(
                comparable(
                    *door.call(f"{PREFIX}/transactions/{tx}/{outcome}", {}, headers_for(producer))
                )
            )
        received = door.call(
            f"{PREFIX}/consumer-groups/lean-c/receive",
            {"topic": "lean", "max_messages": 32, "wait_seconds": 2},
            headers_for(consumer),
        )
        steps.append(comparable(*received))
        handles = [m["receipt_handle"] for m in json.loads(received[2])["messages"]]
        assert len(handles) == 1
        for _round in range(2):
            steps.append(
                comparable(
                    *door.call(
                        f"{PREFIX}/consumer-groups/lean-c/ack",
                        {"receipt_handles": handles},
                        headers_for(consumer),
                    )
                )
            )
        key = {"Idempotency-Key": f"retry-{uuid.uuid4()}"}
        for _round in range(2):
            steps.append(
                comparable(
                    *door.call(
                        f"{PREFIX}/topics/lean/messages",
                        {"producer_group": "lean-p", "body": "once"},
                        headers_for(producer, **key),
                    )
                )
            )
        answers.append(steps)
        # Drained, so the other door's receive finds its own message only.
        drained = door.call(
            f"{PREFIX}/consumer-groups/lean-c/receive",
            {"topic": "lean", "max_messages": 32},
            headers_for(consumer),
        )
        handles = [m["receipt_handle"] for m in json.loads(drained[2])["messages"]]
        assert len(handles) == 1
        acked = door.call(
            f"{PREFIX}/consumer-groups/lean-c/ack",
            {"receipt_handles": handles},
            headers_for(consumer),
        )
        assert json.loads(acked[2])["acked"] == handles
    assert answers[0] == answers[1]
    statuses = [step[0] for step in answers[0]]
    assert statuses == [201, 200, 200, 409, 200, 200, 200, 201, 201]
    assert answers[0][-1][1].get("idempotent-replayed") == "true"


def test_a_waiting_receive_through_the_lean_door_is_woken_by_a_send(
    world: dict[str, str], lean_server: Door, deployment: str
) -> None:
    result: list[Any] = []
    failures: list[BaseException] = []

    def wait() -> None:
        try:
            result.append(
                lean_server.call(
                    f"{PREFIX}/consumer-groups/lean-c/receive",
                    {"topic": "lean", "wait_seconds": 20},
                    headers_for(world["consumer"]),
                )
            )
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
            failures.append(error)

    before = lean_server.lean_answers()
    since = database_now()
    waiter = threading.Thread(target=wait)
    waiter.start()
    # The receive's first try found nothing and it waits: the server's LISTEN connection ran
    # its catch-up check for the registered waiter and idles (the fallback check is 60 s away).
    hub_listening(f"lean-test-lean-{deployment}-wakeups", since=since)
    assert not result
    sent_at = time.monotonic()
    sent = lean_server.call(
        f"{PREFIX}/topics/lean/messages",
        {"producer_group": "lean-p", "body": "wake"},
        headers_for(world["producer"]),
    )
    assert sent[0] == 201
    waiter.join(timeout=25)
    woken_after = time.monotonic() - sent_at
    assert not waiter.is_alive()
    assert not failures, failures
    # Woken by the NOTIFY: long before the wait's 20 s or the 60 s fallback check.
    assert woken_after < 10, woken_after
    status, headers, body = result[0]
    assert status == 200
    assert headers["content-length"] == str(len(body))
    assert [m["body"] for m in json.loads(body)["messages"]] == ["wake"]
    assert lean_server.lean_answers() >= before + 2


@pytest.fixture
def failing_servers(django_db_setup: None) -> Iterator[tuple[Door, Door]]:
    """Both doors with a send that fails after its commit (the `raise` failpoint): a bug."""
    armed = {"TXHUB_FAILPOINTS": "after_send_before_answer=raise", "TXHUB_ALLOW_FAILPOINTS": "1"}
    lean_servers = _start(True, "failing", **armed)
    django_servers = _start(False, "failing", **armed)
    yield next(lean_servers), next(django_servers)
    for servers in (lean_servers, django_servers):
        next(servers, None)


def test_a_bug_is_a_500_in_the_contracts_format_at_both_doors(
    world: dict[str, str], failing_servers: tuple[Door, Door]
) -> None:
    lean_server, django_server = failing_servers
    (status, headers, body), took = both(
        lean_server,
        django_server,
        f"{PREFIX}/topics/lean/messages",
        {"producer_group": "lean-p", "body": "boom"},
        headers_for(world["producer"]),
    )
    assert (status, took) == (500, True)
    assert headers["content-type"] == "application/json"
    assert body["error"]["code"] == "internal_error"
    assert "Traceback" not in json.dumps(body)


def test_the_bench_client_is_answered_by_the_lean_door(
    world: dict[str, str], lean_server: Door
) -> None:
    """`make bench` measures the hot calls through bench/http_client.py (decision 0028): its
    requests must be plain, or the figures would be Django's path."""
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    from http_client import Client

    client = Client(
        f"http://127.0.0.1:{lean_server.port}{PREFIX}", world["admin"], lean_server.proxy
    )
    before = lean_server.lean_answers()
    half = client.post("/transactions", {"producer_group": "lean-p", "topic": "lean", "body": "b"})
    client.post(f"/transactions/{half['transaction_id']}/commit")
    got = client.post("/consumer-groups/lean-c/receive", {"topic": "lean", "max_messages": 8})
    assert [m["body"] for m in got["messages"]] == ["b"]
    handles = [m["receipt_handle"] for m in got["messages"]]
    client.post("/consumer-groups/lean-c/ack", {"receipt_handles": handles})
    assert lean_server.lean_answers() == before + 4


# A plain request as the ASGI server hands it to the lean door (take()'s unit tests).
PLAIN_HEADERS = (
    (b"host", b"127.0.0.1:8000"),
    (b"authorization", b"Bearer abc"),
    (b"content-type", b"application/json"),
    (b"content-length", b"2"),
)


def plain_scope(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/api/v1/transactions",
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "headers": headers,
    }


def test_take_refuses_whatever_is_not_plain() -> None:
    headers = list(PLAIN_HEADERS)
    base = plain_scope(headers)
    assert lean.take(base, b"{}") is not None
    without: list[dict[str, Any]] = [
        {"method": "GET"},
        {"query_string": b"a=1"},
        {"root_path": "/prefix"},
        {"scheme": "websocket"},
        {"path": "/api/v1/topics"},
        {"path": "/api/v1/transactions/"},
        {"headers": [h for h in headers if h[0] != b"host"]},
        {"headers": [h for h in headers if h[0] != b"authorization"]},
        {"headers": [*headers, (b"authorization", b"Bearer other")]},
        {"headers": [*headers, (b"transfer-encoding", b"chunked")]},
        {"headers": [*headers[:3], (b"content-length", b"3")]},
        {"headers": [*headers, (b"cookie", b"sessionid=x")]},
        {
            "headers": [
                *headers[:2],
                (b"content-type", b"application/x-www-form-urlencoded"),
                headers[3],
            ]
        },
        {"headers": [*headers, (b"accept", b"text/html")]},
    ]
    for change in without:
        assert lean.take({**base, **change}, b"{}") is None, change
    for body in (b"[]", b"{", b'{"a": NaN}', b"1", b"x" * 70_000, b"[" * 50_000):
        sized = [*headers[:3], (b"content-length", str(len(body)).encode())]
        assert lean.take({**base, "headers": sized}, body) is None, body[:20]
    # A body without its Content-Length (DRF reads by the declared length): Django's.
    assert lean.take({**base, "headers": headers[:3]}, b'{"a": 1}') is None
    assert lean.take({**base, "headers": [*headers[:3], (b"content-length", b"8")]}, b'{"a": 1}')


def test_the_lean_door_is_off_where_django_would_answer_otherwise(settings: Any) -> None:
    assert lean.enabled()
    for name, value in (
        ("DEBUG", True),
        ("USE_X_FORWARDED_HOST", True),
        ("USE_X_FORWARDED_PORT", True),
        ("TXHUB_LEAN_DOOR", False),
    ):
        before = getattr(settings, name)
        setattr(settings, name, value)
        assert not lean.enabled(), name
        setattr(settings, name, before)


def test_the_lean_door_serves_the_production_settings(settings: Any) -> None:
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 60
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert lean.enabled()
    headers = list(PLAIN_HEADERS)
    scope = plain_scope(headers)
    forwarded = [*headers, (b"x-forwarded-proto", b"https")]
    for secure in (
        {"headers": forwarded},
        {"headers": [*headers, (b"x-forwarded-proto", b"https, http")]},
        {"scheme": "https"},
    ):
        call = lean.take({**scope, **secure}, b"{}")
        assert call is not None, secure
        assert call.secure, secure
    for insecure in (
        {},  # SecurityMiddleware redirects it
        {"headers": [*headers, (b"x-forwarded-proto", b"http")]},
        {"headers": [*headers, (b"x_forwarded_proto", b"https")]},
        {"headers": [*forwarded, (b"x-forwarded-proto", b"https")]},
    ):
        assert lean.take({**scope, **insecure}, b"{}") is None, insecure
    settings.SECURE_SSL_REDIRECT = False
    call = lean.take(scope, b"{}")
    assert call is not None
    assert not call.secure


def test_the_lean_doors_routes_are_the_apis_own() -> None:
    """No hand-copied route table: each hot view's route is api/urls.py's entry (issue 26)."""
    from apps.broker.api import urls as api_urls

    prefix, routes = lean._routes()
    assert prefix == PREFIX + "/"
    assert {route.view for route in routes} == set(lean.HOT_VIEWS)
    assert len(routes) == len(lean.HOT_VIEWS)
    assert all(route.pattern in api_urls.urlpatterns for route in routes)
    call = lean.take(
        {
            "type": "http",
            "method": "POST",
            "path": f"{PREFIX}/transactions/{uuid.UUID(int=1)}/commit",
            "query_string": b"",
            "scheme": "http",
            "headers": [(b"host", b"127.0.0.1:8000"), (b"authorization", b"Bearer abc")],
        },
        b"",
    )
    assert call is not None
    assert call.kwargs == {"transaction_id": uuid.UUID(int=1)}  # converted by Django's converter
