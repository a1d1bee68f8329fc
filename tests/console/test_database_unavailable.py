"""While the database is unreachable (a failover), the console shows a banner with 503 and
retries by itself, never Django's error page or a traceback (CONTRACT 7, decision 0042). Only an
unreachable database is that (services/errors.database_unreachable, decisions 0070 and 0078): a
query that failed is the server error page, which does not reload itself forever.

The faults are Postgres's own, on this thread's real session (tests/support/statement_faults.py):
the first statement of a console request, reading its session, waits on a lock and then has its
session terminated (57P01, as a failover ends every session) or is cancelled (57014, one query
failed, as a statement timeout fails it)."""

from collections.abc import Iterator

import pytest
from django.db import connection
from django.test import Client

from tests.conftest import client_for
from tests.support.console import login
from tests.support.statement_faults import Ending, statement_ended

PATHS = ["/console/", "/console/transactions/", "/console/topics/"]
# What a failed query's page must not show: its SQL, Postgres's message, a traceback.
LEAKS = ("django_session", "SELECT", "canceling", "Traceback", "psycopg")


@pytest.fixture
def console(transactional_db: None) -> Iterator[Client]:
    client = login("superuser", "ops")
    client.raise_request_exception = False  # answered as a server answers it
    yield client
    connection.close()  # a terminated session goes; the next query opens another


def _get(client: Client, path: str, ending: Ending) -> tuple[int, str, str | None]:
    # A session is read from Postgres on every console request: the first statement to wait.
    with statement_ended("django_session", ending) as ended:
        page = client.get(path)
    assert ended, "no statement waited on the lock"
    return page.status_code, page.content.decode(), page.get("Retry-After")


@pytest.mark.parametrize("path", PATHS)
def test_the_console_shows_a_banner_while_the_database_is_unreachable(
    console: Client, path: str
) -> None:
    status, text, retry_after = _get(console, path, "terminate")
    assert status == 503
    assert retry_after == "5"
    assert "The database is unavailable" in text
    assert "Traceback" not in text


@pytest.mark.parametrize("path", PATHS)
def test_a_failed_query_is_the_server_error_page_not_the_banner(console: Client, path: str) -> None:
    status, text, retry_after = _get(console, path, "cancel")
    assert status == 500
    assert retry_after is None
    assert "The database is unavailable" not in text
    assert not [leak for leak in LEAKS if leak in text], text


def test_the_api_keeps_its_own_format(console: Client) -> None:
    api = client_for("admin")
    api.raise_request_exception = False
    with statement_ended("broker_topic", "terminate") as ended:
        answer = api.get("/api/v1/topics")
    assert ended
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "unavailable"
