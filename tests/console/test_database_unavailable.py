"""While the database is unreachable (a failover), the console shows a banner with 503 and
retries by itself, never Django's error page or a traceback (CONTRACT 7, decision 0042)."""

from typing import Any

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.db import OperationalError

from tests.support.console import login


def _database_gone(*args: Any, **kwargs: Any) -> Any:
    raise OperationalError("connection failed: session is read-only")


@pytest.mark.parametrize("path", ["/console/", "/console/transactions/", "/console/topics/"])
def test_the_console_shows_a_banner_while_the_database_is_unreachable(
    db: None, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    client = login("superuser", "ops")
    # A session is read from Postgres on every console request: the first thing to fail.
    monkeypatch.setattr(SessionStore, "load", _database_gone)
    page = client.get(path)
    assert page.status_code == 503
    assert page["Retry-After"] == "5"
    text = page.content.decode()
    assert "The database is unavailable" in text
    assert "Traceback" not in text


def test_the_api_keeps_its_own_format(db: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.broker.api import auth

    monkeypatch.setattr(auth, "user_of", _database_gone)
    answer = login(None, "api").get("/api/v1/topics", HTTP_AUTHORIZATION="Bearer txh_not-looked-up")
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "unavailable"
