"""A check URL's lookup at registration is bounded like a call's (docs/decisions/0087): a host
whose name does not resolve within TXHUB_CHECK_HTTP_TIMEOUT is refused with the check URL's own
400 at every door that registers or changes one, at the deadline, and nothing is stored.

The slow DNS is tests/support/slow_dns.py (the `slow_dns` fixture)."""

import time
from collections.abc import Callable

from rest_framework.test import APIClient

from apps.broker.models import AuditRecord, ProducerGroup
from apps.broker.services import registry
from tests.support.console import login
from tests.support.responses import assert_error, expect
from tests.support.slow_dns import DEADLINE

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
