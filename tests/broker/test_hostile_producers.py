"""Hostile producers (issue 9): a check URL is the producer's, so txhub bounds the whole call,
caps the answer, refuses plain http:// unless allowed, and connects only to the address it
checked (DNS rebinding). Real little HTTP servers play the producers (tests/hostile.py)."""

import ipaddress
import socket
import ssl
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.broker.models import HalfMessage, OpRecord, ProducerGroup
from apps.broker.services import callbacks, checkback, registry
from tests.hostile import FIFTY_MB, HostileEndpoint
from tests.support.console import login
from tests.support.responses import expect
from tests.support.slow_dns import Answer, SlowDns
from tests.support.tls import self_signed
from tests.support.transactions import make_due, make_group, prepare

TIMEOUT = 1.0
SLACK = 3.0  # a generous bound: the call ends at the deadline, plus a busy machine's delays


@pytest.fixture
def hostile(settings: Any) -> Iterator[Any]:
    settings.TXHUB_CHECK_HTTP_TIMEOUT = TIMEOUT
    started: list[HostileEndpoint] = []

    def start(kind: str) -> HostileEndpoint:
        endpoint = HostileEndpoint(kind)
        started.append(endpoint)
        return endpoint

    yield start
    for endpoint in started:
        endpoint.close()


def fetch(half: HalfMessage) -> HalfMessage:
    return HalfMessage.objects.select_related("producer_group", "topic").get(pk=half.pk)


@pytest.mark.parametrize("kind", ["drip-body", "drip-headers"])
def test_a_dripping_endpoint_is_cut_at_the_deadline(db: None, hostile: Any, kind: str) -> None:
    endpoint = hostile(kind)
    group, topic = make_group(endpoint.url), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    started = time.monotonic()
    outcome = callbacks.call_check_url(fetch(half))
    took = time.monotonic() - started
    assert endpoint.requests == 1  # the call was made (the positive control)
    assert endpoint.sent > 0  # and the endpoint had started dripping
    assert took < TIMEOUT + SLACK
    assert outcome.answer == "UNKNOWN"
    assert "TXHUB_CHECK_HTTP_TIMEOUT" in outcome.error
    # Headers that arrived mean the producer answered (a check of the budget); none: unreachable.
    assert outcome.reached is (kind == "drip-body")


def test_an_endpoint_silent_after_its_headers_answered_and_uses_the_budget(
    db: None, settings: Any
) -> None:
    """Headers, then nothing until the deadline: the call is cut there with no byte of the body
    read, and the check counts as answered (it uses the check budget and does not back off)."""
    settings.TXHUB_CHECK_HTTP_TIMEOUT = TIMEOUT
    endpoint = HostileEndpoint("drip-body", interval=60)  # the first byte long after the deadline
    try:
        group, topic = make_group(endpoint.url), registry.topic_create(name="orders", queues=1)
        half = prepare(group, topic)
        make_due(half)
        assert checkback.checkback_claim_due() == [half.pk]
        assert checkback.checkback_run(half_id=half.pk) == "unknown"
    finally:
        endpoint.close()
    assert (endpoint.requests, endpoint.sent) == (1, 0)  # the headers alone were sent
    half.refresh_from_db()
    assert (half.state, half.check_times, half.unreachable_checks) == ("PREPARED", 1, 0)
    [check] = OpRecord.objects.filter(half=half, op="CHECK")
    assert (check.detail["answer"], check.detail["reached"]) == ("UNKNOWN", True)
    assert "TXHUB_CHECK_HTTP_TIMEOUT" in check.detail["error"]


def test_a_50_mb_answer_is_not_read_whole_and_is_not_a_decision(db: None, hostile: Any) -> None:
    endpoint = hostile("huge")
    group, topic = make_group(endpoint.url), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    outcome = callbacks.call_check_url(fetch(half))
    assert endpoint.requests == 1
    assert (outcome.answer, outcome.reached) == ("UNKNOWN", True)
    assert outcome.error == f"the answer is larger than {callbacks.MAX_ANSWER_BYTES} bytes"
    assert endpoint.sent < FIFTY_MB  # txhub hung up long before the end


def test_a_commit_after_50_mb_of_padding_is_recorded_as_an_error_and_not_applied(
    db: None, hostile: Any
) -> None:
    endpoint = hostile("padded-commit")
    group, topic = make_group(endpoint.url), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    make_due(half)
    assert checkback.checkback_claim_due() == [half.pk]
    assert checkback.checkback_run(half_id=half.pk) == "unknown"
    half.refresh_from_db()
    assert half.state == "PREPARED"
    [check] = OpRecord.objects.filter(half=half, op="CHECK")
    assert check.detail["answer"] == "UNKNOWN"
    assert check.detail["applied"] is False
    assert "larger than" in check.detail["error"]
    assert not OpRecord.objects.filter(half=half, op="COMMIT").exists()


def test_the_consoles_test_callback_is_bounded_too(db: None, hostile: Any) -> None:
    endpoint = hostile("drip-body")
    group = make_group(endpoint.url)
    started = time.monotonic()
    outcome = callbacks.checkback_test(group=group)
    assert endpoint.requests == 1
    assert time.monotonic() - started < TIMEOUT + SLACK
    assert outcome.answer == "UNKNOWN"
    assert "TXHUB_CHECK_HTTP_TIMEOUT" in outcome.error


def test_an_answer_under_the_cap_is_still_a_decision(db: None, checker: Any) -> None:
    checker.decide = lambda body: (200, b" " * (60 * 1024) + b'{"state": "COMMIT"}')
    group, topic = make_group(checker.url), registry.topic_create(name="orders", queues=1)
    outcome = callbacks.call_check_url(fetch(prepare(group, topic)))
    assert (outcome.answer, outcome.error) == ("COMMIT", "")


# http:// ---------------------------------------------------------------------------------------


def test_http_check_urls_are_refused_unless_allowed(
    api: APIClient, settings: Any, checker: Any
) -> None:
    settings.TXHUB_ALLOW_HTTP_CALLBACKS = False
    response = api.post(
        "/api/v1/producer-groups", {"name": "shop", "check_url": checker.url}, format="json"
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert "https://" in error["details"]["check_url"][0]
    assert not ProducerGroup.objects.exists()
    settings.TXHUB_ALLOW_HTTP_CALLBACKS = True  # the positive control
    created = api.post(
        "/api/v1/producer-groups", {"name": "shop", "check_url": checker.url}, format="json"
    )
    assert created.status_code == 201


def test_an_http_check_url_is_refused_at_call_time_once_disallowed(
    db: None, settings: Any, checker: Any
) -> None:
    checker.answer("COMMIT")
    group, topic = make_group(checker.url), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    settings.TXHUB_ALLOW_HTTP_CALLBACKS = False
    outcome = callbacks.call_check_url(fetch(half))
    assert (outcome.answer, outcome.reached) == ("UNKNOWN", False)
    assert "http://" in outcome.error
    assert checker.requests == []


# DNS rebinding ---------------------------------------------------------------------------------


def register_at_dns(dns: SlowDns, url: str) -> Any:
    """The group "shop" registered with `url` through REST, in a process whose lookups ask the
    test's DNS server (tests/support/slow_dns.py)."""
    _, token = registry.token_create(name="admin-test", scopes=["admin"])
    step = {"method": "post", "path": "/api/v1/producer-groups"}
    asked = dns.run(
        "requests", steps=[{**step, "data": {"name": "shop", "check_url": url}}], token=token
    )
    [created] = [Answer(answer) for answer in asked["answers"]]
    expect(created, 201)
    return ProducerGroup.objects.get(name="shop")


def test_the_call_connects_to_the_address_it_checked(checker: Any, slow_dns: SlowDns) -> None:
    """`rebind.invalid` does not resolve in real DNS: the call can only reach the checker if it
    connects to the address the lookup answered (and was checked), never to a second lookup; the
    Host header still names the host."""
    checker.answer("COMMIT")
    port = checker.url.split(":")[2].split("/")[0]
    slow_dns.arm(0.0, "127.0.0.1")
    url = f"http://rebind.invalid:{port}/check"
    group, topic = register_at_dns(slow_dns, url), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    slow_dns.asked.clear()
    [outcome] = slow_dns.run("calls", half_id=half.pk, count=1)["outcomes"]
    assert (outcome["answer"], outcome["error"]) == ("COMMIT", "")
    assert slow_dns.asked == ["rebind.invalid"]  # one lookup per call
    assert checker.requests[-1]["headers"]["host"] == f"rebind.invalid:{port}"


def test_https_keeps_the_host_name_for_sni_and_the_certificate(
    slow_dns: SlowDns, tmp_path: Path
) -> None:
    """Pinned to the checked address, an https call still names the URL's host in its TLS
    handshake (SNI; urllib3 checks the certificate against the same name): a real TLS server on
    that address sees the name, and its certificate, which no CA vouches for, is refused, so no
    decision comes of it (decision 0116)."""
    cert, key = self_signed(tmp_path, "producer.invalid")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    named: list[str | None] = []
    context.sni_callback = lambda _socket, name, _context: named.append(name)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)

    def handshake() -> str:
        """The server's side of the one call: what the caller said of the certificate."""
        accepted, _ = listener.accept()
        with accepted:
            accepted.settimeout(10)
            try:
                context.wrap_socket(accepted, server_side=True).close()
            except ssl.SSLError as refused:
                return str(refused.reason)
        raise AssertionError("the call accepted a certificate that no CA vouches for")

    slow_dns.arm(0.0, "127.0.0.1")
    url = f"https://producer.invalid:{listener.getsockname()[1]}/check"
    group = register_at_dns(slow_dns, url)
    half = prepare(group, registry.topic_create(name="orders", queues=1))
    slow_dns.asked.clear()
    with listener, ThreadPoolExecutor(1) as pool:
        server_side = pool.submit(handshake)
        [outcome] = slow_dns.run("calls", half_id=half.pk, count=1)["outcomes"]
        refused = server_side.result(timeout=30)
    assert named == ["producer.invalid"]  # reached the pinned address, naming the host
    assert "UNKNOWN_CA" in refused, refused  # the caller refused the certificate
    assert (outcome["answer"], outcome["reached"], outcome["error"]) == (
        "UNKNOWN",
        False,
        "SSLError",
    )
    assert slow_dns.asked == ["producer.invalid"]  # one lookup


@pytest.mark.parametrize("second", ["169.254.169.254", "10.1.2.3"])
def test_a_host_that_rebinds_to_an_internal_address_is_refused(
    checker: Any, slow_dns: SlowDns, second: str
) -> None:
    checker.answer("COMMIT")
    port = checker.url.split(":")[2].split("/")[0]
    slow_dns.arm(0.0, "127.0.0.1")  # registered while it resolved to an allowed address
    group = register_at_dns(slow_dns, f"http://rebind.invalid:{port}/check")
    half = prepare(group, registry.topic_create(name="orders", queues=1))
    slow_dns.arm(0.0, second)
    [outcome] = slow_dns.run("calls", half_id=half.pk, count=1)["outcomes"]
    assert (outcome["answer"], outcome["reached"]) == ("UNKNOWN", False)
    assert second in outcome["error"]
    assert checker.requests == []


def test_every_address_of_an_answer_is_checked(slow_dns: SlowDns) -> None:
    slow_dns.arm(0.0, "127.0.0.1", "169.254.169.254")
    checked = slow_dns.run("url_check", url="http://rebind.invalid/check")
    assert "169.254.169.254" in checked["refused"]


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "64:ff9b::808:808",  # NAT64 of a public address: still a gateway
        "64:ff9b:1::a00:1",  # NAT64 local-use prefix
        "2002:a9fe:a9fe::1",  # 6to4
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
        "::ffff:127.0.0.1",  # IPv4-mapped loopback (not in 127.0.0.0/8 as written)
        "::ffff:8.8.8.8",  # IPv4-mapped public
        "::a9fe:a9fe",  # IPv4-compatible
    ],
)
def test_ipv6_forms_that_embed_ipv4_are_refused(slow_dns: SlowDns, address: str) -> None:
    slow_dns.arm(0.0, address)
    checked = slow_dns.run("url_check", url="https://producer.invalid/check")
    # Refused for the address the test's DNS server answered, not as a name that does not resolve
    assert f"resolves to {ipaddress.ip_address(address)}," in checked.get("refused", ""), checked
    assert slow_dns.asked == ["producer.invalid"]  # the answer came from the test's DNS server


@pytest.mark.parametrize("address", ["224.0.0.251", "239.1.2.3", "ff0e::1", "ff02::fb"])
def test_multicast_addresses_are_refused(slow_dns: SlowDns, address: str) -> None:
    """Multicast addresses count as global to Python's ipaddress, so they are refused by name."""
    slow_dns.arm(0.0, address)
    checked = slow_dns.run("url_check", url="https://producer.invalid/check")
    assert f"resolves to {ipaddress.ip_address(address)}," in checked.get("refused", ""), checked
    assert slow_dns.asked == ["producer.invalid"]  # the answer came from the test's DNS server


def test_an_allowlisted_translated_network_is_allowed(slow_dns: SlowDns) -> None:
    slow_dns.arm(0.0, "64:ff9b::a00:1")
    checked = slow_dns.run(
        "url_check",
        {"TXHUB_CALLBACK_ALLOWED_HOSTS": "64:ff9b::/96"},
        url="https://producer.invalid/check",
    )
    assert checked == {"addresses": ["64:ff9b::a00:1"]}


def test_a_worker_warns_when_one_group_can_fill_the_callback_workers(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from apps.broker.tasks import warn_if_one_group_can_fill_the_callbacks

    settings.TXHUB_CALLBACK_CONCURRENCY = 8
    settings.TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP = 2
    warn_if_one_group_can_fill_the_callbacks()
    assert not caplog.records  # the positive control: the default arithmetic is quiet
    settings.TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP = 8
    warn_if_one_group_can_fill_the_callbacks()
    [record] = caplog.records
    assert record.levelname == "WARNING"
    assert "TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP (8) >= TXHUB_CALLBACK_CONCURRENCY (8)" in (
        record.getMessage()
    )


def test_the_console_refuses_an_http_check_url_on_the_form(db: None, settings: Any) -> None:
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/check")
    settings.TXHUB_ALLOW_HTTP_CALLBACKS = False
    otto = login("txhub-operators", "otto")
    for path, data in [
        ("/console/producer-groups/new/", {"name": "pay", "check_url": "http://127.0.0.1:9/c"}),
        ("/console/producer-groups/shop/edit/", {"check_url": "http://127.0.0.1:9/other"}),
    ]:
        response = otto.post(path, data)
        assert response.status_code == 200, path
        page = response.content.decode()
        assert 'class="errorlist' in page
        assert "plain http:// is refused" in page
    assert list(ProducerGroup.objects.values_list("name", "check_url")) == [
        ("shop", "http://127.0.0.1:9/check")
    ]
