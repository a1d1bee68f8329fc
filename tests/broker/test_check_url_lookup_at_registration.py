"""A check URL's lookup at registration is bounded like a call's (docs/decisions/0087): a host
whose name does not resolve within TXHUB_CHECK_HTTP_TIMEOUT is refused with the check URL's own
400 at every door that registers or changes one, at the deadline, and nothing is stored.

The slow DNS is tests/support/slow_dns.py (the `slow_dns` fixture)."""

import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections
from rest_framework.test import APIClient

from apps.broker.models import AuditRecord, ProducerGroup
from apps.broker.services import registry
from tests.conftest import client_for
from tests.support.console import login
from tests.support.responses import assert_error, expect
from tests.support.slow_dns import DEADLINE, lookup_threads
from tests.support.statement_faults import own_connection

MARGIN = 1.0  # past the deadline: a busy machine's delays
SLOW_URL = "http://slow-dns.invalid:9/check"
REFUSAL = "The host 'slow-dns.invalid' was not resolved within TXHUB_CHECK_HTTP_TIMEOUT (1 s)."


def test_registering_a_check_url_whose_lookup_overruns_is_refused_at_the_deadline(
    api: APIClient, slow_dns: Callable[..., None]
) -> None:
    slow_dns(6 * DEADLINE)
    started = time.monotonic()
    response = api.post(
        "/api/v1/producer-groups", {"name": "pg", "check_url": SLOW_URL}, format="json"
    )
    took = time.monotonic() - started
    assert took < DEADLINE + MARGIN, f"the request took {took:.2f} s"
    error = assert_error(response, 400, "invalid_request")
    assert (error["message"], error["details"]) == (REFUSAL, {"check_url": [REFUSAL]})
    assert not ProducerGroup.objects.exists()


def test_changing_a_check_url_to_one_whose_lookup_overruns_is_refused_at_the_deadline(
    api: APIClient, slow_dns: Callable[..., None]
) -> None:
    expect(api.post("/api/v1/producer-groups", {"name": "pg"}, format="json"), 201)
    slow_dns(6 * DEADLINE)
    started = time.monotonic()
    response = api.patch("/api/v1/producer-groups/pg", {"check_url": SLOW_URL}, format="json")
    took = time.monotonic() - started
    assert took < DEADLINE + MARGIN, f"the request took {took:.2f} s"
    error = assert_error(response, 400, "invalid_request")
    assert error["details"] == {"check_url": [REFUSAL]}
    assert ProducerGroup.objects.get(name="pg").check_url == ""
    assert not AuditRecord.objects.filter(target="pg").exists()


def test_the_console_refuses_a_check_url_whose_lookup_overruns_at_the_deadline(
    db: None, slow_dns: Callable[..., None]
) -> None:
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/check")
    operator = login("txhub-operators", "otto")
    slow_dns(6 * DEADLINE)
    for path, form in [
        ("/console/producer-groups/new/", {"name": "pay", "check_url": SLOW_URL}),
        ("/console/producer-groups/shop/edit/", {"check_url": SLOW_URL}),
    ]:
        started = time.monotonic()
        page = operator.post(path, form)
        took = time.monotonic() - started
        assert took < DEADLINE + MARGIN, f"{path} took {took:.2f} s"
        assert page.status_code == 200  # the form again, with the refusal among its errors
        assert "was not resolved within TXHUB_CHECK_HTTP_TIMEOUT (1 s)" in page.content.decode()
    assert list(ProducerGroup.objects.values_list("name", "check_url")) == [
        ("shop", "http://127.0.0.1:9/check")
    ]


def test_a_check_url_whose_lookup_answers_in_time_is_registered(
    api: APIClient, slow_dns: Callable[..., None]
) -> None:
    """The control: a lookup slower than usual but within the deadline registers the URL."""
    slow_dns(0.2)
    created = api.post(
        "/api/v1/producer-groups", {"name": "pg", "check_url": SLOW_URL}, format="json"
    )
    assert expect(created, 201)["check_url"] == SLOW_URL
    assert ProducerGroup.objects.get(name="pg").check_url == SLOW_URL


def _transactions_during_lookups(request: Callable[[], Any]) -> tuple[Any, set[str]]:
    """`request()`'s answer (made in this thread), and what was inside a transaction while a
    check URL's lookup was under way, seen from a thread and a session of the test's own: the
    state of each session in one ("idle in transaction"...), and "atomic" when this thread's
    connection was in an atomic block (psycopg sends its BEGIN only with the first statement,
    so a block is a transaction at the database as soon as anything in it queries)."""
    requesting = connections["default"]  # this thread's: the test client's view runs here
    seen: set[str] = set()
    looked_up = threading.Event()
    done = threading.Event()

    def watch() -> None:
        with own_connection(autocommit=True) as watcher:
            while not done.is_set():
                if lookup_threads():
                    looked_up.set()
                    if requesting.in_atomic_block:
                        seen.add("atomic")
                    rows = watcher.execute(
                        "SELECT state FROM pg_stat_activity WHERE datname = current_database() "
                        "AND xact_start IS NOT NULL AND pid <> pg_backend_pid()"
                    ).fetchall()
                    seen.update(str(state) for (state,) in rows)
                time.sleep(0.01)

    watching = threading.Thread(target=watch)
    watching.start()
    try:
        answer = request()
    finally:
        done.set()
        watching.join()
    assert looked_up.is_set(), "no lookup was seen under way"
    return answer, seen


def test_a_check_urls_slow_lookup_holds_no_transaction_open(
    transactional_db: None, slow_dns: Callable[..., None]
) -> None:
    """The lookup runs before the write's transaction opens, at creation and at a change
    (docs/decisions/0087): a slow DNS never holds a transaction (a row lock, a connection in a
    transaction) for up to TXHUB_CHECK_HTTP_TIMEOUT."""
    api = client_for("admin", name="admin-test")
    expect(api.post("/api/v1/producer-groups", {"name": "pg"}, format="json"), 201)
    slow_dns(DEADLINE / 2)  # in time: the URL is registered
    created, during_create = _transactions_during_lookups(
        lambda: api.post(
            "/api/v1/producer-groups", {"name": "pg2", "check_url": SLOW_URL}, format="json"
        )
    )
    expect(created, 201)
    changed, during_change = _transactions_during_lookups(
        lambda: api.patch("/api/v1/producer-groups/pg", {"check_url": SLOW_URL}, format="json")
    )
    assert expect(changed, 200)["check_url"] == SLOW_URL
    assert (during_create, during_change) == (set(), set())
