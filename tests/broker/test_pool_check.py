"""The pool's checkout check (txhub/postgres/base.py) costs no round trip on a healthy idle
connection and still catches one that Postgres closed."""

import time
from typing import Any

import psycopg
import pytest
from django.db import connection

from txhub.postgres.base import _looks_alive

pytestmark = pytest.mark.django_db


def _own_connection() -> psycopg.Connection:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    return psycopg.connect(**params, autocommit=True)


def _queries_run(conn: psycopg.Connection, pid: int) -> Any:
    # pg_stat_activity.query_start of the pid: it moves whenever that backend runs a statement.
    with connection.cursor() as cursor:
        cursor.execute("SELECT query_start FROM pg_stat_activity WHERE pid = %s", [pid])
        return cursor.fetchone()[0]


def test_a_healthy_idle_connection_passes_without_a_query() -> None:
    conn = _own_connection()
    try:
        pid = conn.info.backend_pid
        conn.execute("SELECT 1")
        started = _queries_run(conn, pid)
        for _ in range(20):
            assert _looks_alive(conn)
        assert _queries_run(conn, pid) == started  # the check ran no statement
    finally:
        conn.close()


def test_a_connection_postgres_closed_fails_the_cheap_check() -> None:
    conn = _own_connection()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])
        deadline = time.monotonic() + 5
        while _looks_alive(conn) and time.monotonic() < deadline:
            time.sleep(0.01)  # the backend's exit reaches our socket a moment later
        assert not _looks_alive(conn)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("")  # and it really was dead: the full check would have failed too
    finally:
        conn.close()


def test_a_connection_inside_a_transaction_is_not_taken_as_idle() -> None:
    conn = _own_connection()
    try:
        conn.execute("BEGIN")
        assert not _looks_alive(conn)
    finally:
        conn.close()


def test_a_closed_connection_fails_the_cheap_check() -> None:
    conn = _own_connection()
    conn.close()
    assert not _looks_alive(conn)
