"""A check URL's lookup at registration is bounded like a call's (docs/decisions/0087): a host
whose name does not resolve within TXHUB_CHECK_HTTP_TIMEOUT is refused with the check URL's own
400 at every door that registers or changes one, at the deadline, and nothing is stored.

The slow DNS is a DNS server of the test's own, asked by glibc's getaddrinfo in a process of the
test's own (tests/support/slow_dns.py, the `slow_dns` fixture; docs/decisions/0096)."""

from typing import Any

from apps.broker.models import AuditRecord, ProducerGroup
from apps.broker.services import registry
from tests.conftest import client_for
from tests.support.console import login
from tests.support.responses import assert_error, expect
from tests.support.slow_dns import DEADLINE, SLOW_HOST, Answer, SlowDns

MARGIN = 1.0  # past the deadline: a busy machine's delays
SLOW_URL = f"http://{SLOW_HOST}:9/check"
REFUSAL = f"The host '{SLOW_HOST}' was not resolved within TXHUB_CHECK_HTTP_TIMEOUT (1 s)."


def admin_token() -> str:
    return str(registry.token_create(name="admin-test", scopes=["admin"])[1])


def send(dns: SlowDns, *steps: dict[str, Any], **who: Any) -> list[Answer]:
    """The answers to `steps`, sent in order by the test client of a process whose DNS is the
    test's own."""
    return [Answer(answer) for answer in dns.run("requests", steps=list(steps), **who)["answers"]]


def test_registering_a_check_url_whose_lookup_overruns_is_refused_at_the_deadline(
    slow_dns: SlowDns,
) -> None:
    slow_dns.arm(6 * DEADLINE)
    [response] = send(
        slow_dns,
        {
            "method": "post",
            "path": "/api/v1/producer-groups",
            "data": {"name": "pg", "check_url": SLOW_URL},
        },
        token=admin_token(),
    )
    assert response.took < DEADLINE + MARGIN, f"the request took {response.took:.2f} s"
    error = assert_error(response, 400, "invalid_request")
    assert (error["message"], error["details"]) == (REFUSAL, {"check_url": [REFUSAL]})
    assert not ProducerGroup.objects.exists()


def test_changing_a_check_url_to_one_whose_lookup_overruns_is_refused_at_the_deadline(
    slow_dns: SlowDns,
) -> None:
    api = client_for("admin", name="admin-test")
    expect(api.post("/api/v1/producer-groups", {"name": "pg"}, format="json"), 201)
    slow_dns.arm(6 * DEADLINE)
    [response] = send(
        slow_dns,
        {"method": "patch", "path": "/api/v1/producer-groups/pg", "data": {"check_url": SLOW_URL}},
        token=admin_token(),
    )
    assert response.took < DEADLINE + MARGIN, f"the request took {response.took:.2f} s"
    error = assert_error(response, 400, "invalid_request")
    assert error["details"] == {"check_url": [REFUSAL]}
    assert ProducerGroup.objects.get(name="pg").check_url == ""
    assert not AuditRecord.objects.filter(target="pg").exists()


def test_the_console_refuses_a_check_url_whose_lookup_overruns_at_the_deadline(
    slow_dns: SlowDns,
) -> None:
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/check")
    login("txhub-operators", "otto")
    slow_dns.arm(6 * DEADLINE)
    steps = [
        {"path": "/console/producer-groups/new/", "data": {"name": "pay", "check_url": SLOW_URL}},
        {"path": "/console/producer-groups/shop/edit/", "data": {"check_url": SLOW_URL}},
    ]
    pages = send(
        slow_dns, *[{**step, "method": "post", "form": True} for step in steps], user="otto"
    )
    for step, page in zip(steps, pages, strict=True):
        assert page.took < DEADLINE + MARGIN, f"{step['path']} took {page.took:.2f} s"
        assert page.status_code == 200  # the form again, with the refusal among its errors
        assert "was not resolved within TXHUB_CHECK_HTTP_TIMEOUT (1 s)" in page.content.decode()
    assert list(ProducerGroup.objects.values_list("name", "check_url")) == [
        ("shop", "http://127.0.0.1:9/check")
    ]


def test_a_check_url_whose_lookup_answers_in_time_is_registered(slow_dns: SlowDns) -> None:
    """The control: a lookup slower than usual but within the deadline registers the URL."""
    slow_dns.arm(0.2)
    [created] = send(
        slow_dns,
        {
            "method": "post",
            "path": "/api/v1/producer-groups",
            "data": {"name": "pg", "check_url": SLOW_URL},
        },
        token=admin_token(),
    )
    assert expect(created, 201)["check_url"] == SLOW_URL
    assert ProducerGroup.objects.get(name="pg").check_url == SLOW_URL


def test_a_check_urls_slow_lookup_holds_no_transaction_open(slow_dns: SlowDns) -> None:
    """The lookup runs before the write's transaction opens, at creation and at a change
    (docs/decisions/0087): a slow DNS never holds a transaction (a row lock, a connection in a
    transaction) for up to TXHUB_CHECK_HTTP_TIMEOUT."""
    api = client_for("admin", name="admin-test")
    expect(api.post("/api/v1/producer-groups", {"name": "pg"}, format="json"), 201)
    slow_dns.arm(DEADLINE / 2)  # in time: the URL is registered
    watched = slow_dns.run(
        "watched_requests",
        steps=[
            {
                "method": "post",
                "path": "/api/v1/producer-groups",
                "data": {"name": "pg2", "check_url": SLOW_URL},
            },
            {
                "method": "patch",
                "path": "/api/v1/producer-groups/pg",
                "data": {"check_url": SLOW_URL},
            },
        ],
        token=admin_token(),
    )
    created, changed = [Answer(answer) for answer in watched]
    assert (created.looked_up, changed.looked_up) == (True, True), "no lookup was seen under way"
    expect(created, 201)
    assert expect(changed, 200)["check_url"] == SLOW_URL
    assert (created.seen, changed.seen) == ([], [])


def test_the_watcher_sees_a_lookup_made_inside_a_transaction(slow_dns: SlowDns) -> None:
    """The positive control of the test above: the same request sent inside a transaction of the
    probe's own that has queried is seen, by the same watcher, in an atomic block whose session
    is idle in transaction during the lookup (decision 0116)."""
    slow_dns.arm(DEADLINE / 2)
    step = {
        "method": "post",
        "path": "/api/v1/producer-groups",
        "data": {"name": "pg", "check_url": SLOW_URL},
    }
    [created] = [
        Answer(answer)
        for answer in slow_dns.run(
            "watched_requests", steps=[step], token=admin_token(), in_transaction=True
        )
    ]
    assert created.looked_up, "no lookup was seen under way"
    expect(created, 201)
    assert {"atomic", "idle in transaction"} <= set(created.seen), created.seen
