"""The REST door answers a database fault as the gRPC door does (docs/decisions/0070, 0078): 503
`unavailable` only when the database cannot be reached (services/errors.database_unreachable),
which clients retry; a query that failed (a statement timeout, a cancelled statement) is 500
`internal_error`, which they do not retry forever. Either way nothing is stored.

The faults are Postgres's own, on real sessions (tests/support/statement_faults.py): a send's
statement (or a large send's token lookup, made before its body is read) waits on a lock and is
cancelled, timed out, has its session terminated or its connection cut. Through real web
servers, with the lean door (its fast path takes a send) and without it (DRF answers), and in
this process through DRF's test client."""

import http.client
import json
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from apps.broker.api import views
from apps.broker.models import CommitLogEntry
from apps.broker.services import registry
from tests.conftest import client_for, start_gunicorn
from tests.support import workers
from tests.support.metrics import METRICS_HEADERS
from tests.support.ports import free_port
from tests.support.statement_faults import CuttingProxy, Ending, statement_ended

SEND = "/api/v1/topics/faults/messages"
BODY = {"producer_group": "faults-p", "body": "never stored"}
# What a send writes, and so what its statement waits on while the table is locked.
TABLE = "broker_commitlogentry"
# What a large body's token lookup before its body is read waits on while the table is locked.
TOKENS = "broker_apitoken"
# What a failed query's answer must not show: its SQL, Postgres's message, a traceback.
LEAKS = ("broker_", "INSERT", "canceling", "terminating", "Traceback", "psycopg")


class Door:
    def __init__(self, port: int, lean: bool, proxy: CuttingProxy) -> None:
        self.port, self.lean, self.proxy = port, lean, proxy

    def send(self, token: str, body: dict[str, str] = BODY) -> tuple[int, dict[str, str], str]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            connection.request("POST", SEND, json.dumps(body), headers)
            response = connection.getresponse()
            got = {name.lower(): value for name, value in response.getheaders()}
            return response.status, got, response.read().decode()
        finally:
            connection.close()

    def lean_answers(self) -> float:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request("GET", "/metrics", headers=METRICS_HEADERS)
            text = connection.getresponse().read().decode()
        finally:
            connection.close()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("txhub_lean_door_answers_total")
        )


@pytest.fixture(scope="module", params=["lean", "django"])
def door(request: pytest.FixtureRequest, django_db_setup: None) -> Iterator[Door]:
    lean = request.param == "lean"
    port = free_port()
    db = settings.DATABASES["default"]
    proxy = CuttingProxy((db["HOST"], int(db["PORT"])))  # the server's way to Postgres
    env = {
        "TXHUB_LEAN_DOOR": "1" if lean else "0",
        "DATABASE_URL": f"postgres://{db['USER']}@127.0.0.1:{proxy.port}/{db['NAME']}",
    }
    with open(workers.log_path(f"test-gunicorn-faults-{request.param}.log"), "w") as log:
        # One worker: /metrics then reads the one process that answered.
        process = start_gunicorn(port, workers=1, log=log, extra_env=env)
        yield Door(port, lean, proxy)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    proxy.close()


@pytest.fixture
def token(transactional_db: None, setup_topic: Any) -> str:
    setup_topic(topic="faults", producer="faults-p", consumer="faults-c")
    return registry.token_create(name="faults", scopes=["produce:faults-p"])[1]


def _answer(door: Door, token: str, ending: Ending) -> tuple[int, dict[str, str], str]:
    before = door.lean_answers()
    proxy = door.proxy if ending == "cut" else None
    with statement_ended(TABLE, ending, proxy) as ended:
        status, headers, text = door.send(token)
    assert ended, "no statement waited on the lock"
    # The lean door took the send, or (without it) Django did.
    assert (door.lean_answers() > before) is door.lean
    assert not CommitLogEntry.objects.exists()  # nothing stored
    return status, headers, text


def test_a_send_whose_session_is_terminated_answers_503_unavailable(door: Door, token: str) -> None:
    """The positive control: a failover ends every session (57P01); that is an outage."""
    status, headers, text = _answer(door, token, "terminate")
    assert status == 503, text
    assert headers["content-type"] == "application/json"
    assert json.loads(text)["error"]["code"] == "unavailable"
    assert headers["retry-after"] == "1"  # as every 503 (docs/decisions/0086)
    assert door.send(token)[0] == 201  # the next request gets a live connection


def test_a_large_send_whose_token_lookup_loses_its_session_answers_503_unavailable(
    door: Door, token: str
) -> None:
    """A body above views.LARGE_BODY_BYTES has its token looked up before it is read, outside
    DRF (txhub/web.py, docs/decisions/0032): the database lost there is the same 503 `unavailable`
    with Retry-After as anywhere else (decisions 0078 and 0086), not a server error."""
    large = {**BODY, "body": "x" * (views.LARGE_BODY_BYTES + 1)}
    with statement_ended(TOKENS, "terminate") as ended:
        status, headers, text = door.send(token, large)
    assert ended, "no token lookup waited on the lock"
    assert status == 503, text
    assert headers["content-type"] == "application/json"
    assert json.loads(text)["error"]["code"] == "unavailable"
    assert headers["retry-after"] == "1"
    assert not CommitLogEntry.objects.exists()  # nothing stored
    assert door.send(token, large)[0] == 201  # the next request gets a live connection


def test_a_large_send_whose_token_lookup_fails_answers_500_internal_error(
    door: Door, token: str
) -> None:
    """There too, a query that failed is the contract's 500, in its format, leaking nothing."""
    large = {**BODY, "body": "x" * (views.LARGE_BODY_BYTES + 1)}
    with statement_ended(TOKENS, "cancel") as ended:
        status, headers, text = door.send(token, large)
    assert ended, "no token lookup waited on the lock"
    assert status == 500, text
    assert headers["content-type"] == "application/json"
    assert json.loads(text)["error"]["code"] == "internal_error"
    assert not [leak for leak in LEAKS if leak in text], text
    assert not CommitLogEntry.objects.exists()


def test_a_send_whose_connection_is_cut_answers_503_unavailable(door: Door, token: str) -> None:
    """The positive control of a lost connection without a SQLSTATE (a crash of the database's
    machine, a partition): libpq's own error, judged by the broken connection it left."""
    status, headers, text = _answer(door, token, "cut")
    assert status == 503, text
    assert json.loads(text)["error"]["code"] == "unavailable"
    assert door.send(token)[0] == 201  # the pool replaced its dead connections


def test_a_send_whose_statement_fails_answers_500_internal_error(door: Door, token: str) -> None:
    status, headers, text = _answer(door, token, "cancel")
    assert status == 500, text
    assert headers["content-type"] == "application/json"
    assert json.loads(text)["error"]["code"] == "internal_error"
    assert not [leak for leak in LEAKS if leak in text], text
    assert door.send(token)[0] == 201  # the connection was fine


def test_a_statement_timeout_at_drf_answers_500_internal_error(transactional_db: None) -> None:
    """In this process, DRF's test client on this thread's session, a real statement_timeout."""
    registry.topic_create(name="faults", queues=1)
    registry.producer_group_create(name="faults-p", check_url="http://127.0.0.1:9/")
    client = client_for("produce:faults-p")
    client.raise_request_exception = False  # answered as a server answers it
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = '200ms'")
    try:
        with statement_ended(TABLE, "timeout"):
            answer = client.post(SEND, BODY, format="json")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET statement_timeout")
    assert answer.status_code == 500, answer.content
    assert answer.json()["error"]["code"] == "internal_error"
    assert not [leak for leak in LEAKS if leak in answer.content.decode()]
    assert not CommitLogEntry.objects.exists()


def test_a_lost_session_at_drf_answers_503_unavailable(transactional_db: None) -> None:
    """The positive control in this process: this thread's session terminated mid-statement."""
    registry.topic_create(name="faults", queues=1)
    registry.producer_group_create(name="faults-p", check_url="http://127.0.0.1:9/")
    client = client_for("produce:faults-p")
    client.raise_request_exception = False
    try:
        with statement_ended(TABLE, "terminate") as ended:
            answer = client.post(SEND, BODY, format="json")
    finally:
        connection.close()  # the dead session goes; the next query opens another
    assert ended
    assert answer.status_code == 503, answer.content
    assert answer.json()["error"]["code"] == "unavailable"
    assert answer["Retry-After"] == "1"  # as every 503 (docs/decisions/0086)
    assert not CommitLogEntry.objects.exists()
