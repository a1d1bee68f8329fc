"""Calling a producer group's check URL: the URL policy (checked at registration and at every
call), Standard Webhooks signing, and the bounded, pinned HTTP call whose answer is COMMIT,
ROLLBACK or UNKNOWN (never a decision unless a 200 says one). Check-back (checkback.py) and the
console's "test callback" call it; nothing here writes to the database.
"""

import base64
import contextlib
import hashlib
import hmac
import ipaddress
import json
import secrets
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import requests
import urllib3
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.utils import timezone
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from apps.broker import failpoints
from apps.broker.models import HalfMessage, ProducerGroup
from apps.broker.services.errors import CallbackRefused, LookupUnfinished

# RocketMQ's names are accepted too; anything else is never a decision.
ANSWERS = {
    "COMMIT": "COMMIT",
    "COMMIT_MESSAGE": "COMMIT",
    "ROLLBACK": "ROLLBACK",
    "ROLLBACK_MESSAGE": "ROLLBACK",
    "UNKNOWN": "UNKNOWN",
    "UNKNOW": "UNKNOWN",
}


# Signing (Standard Webhooks) -------------------------------------------------------------------


def signature(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def signing_secrets(group: ProducerGroup) -> list[str]:
    """The current secret, and the previous one while its rotation grace lasts."""
    keys = [group.signing_secret]
    grace = timedelta(seconds=settings.TXHUB_SECRET_ROTATION_GRACE)
    rotated_at = group.secret_rotated_at
    if group.previous_signing_secret and rotated_at and timezone.now() - rotated_at < grace:
        keys.append(group.previous_signing_secret)
    return keys


# Callback URL policy ---------------------------------------------------------------------------

# IPv6 forms that carry an IPv4 address (or reach one through a gateway): refused outside the
# allowlist whatever the embedded address, since the gateway may lead into a private network.
TRANSLATED_NETWORKS = [
    ipaddress.ip_network("64:ff9b::/96"),  # NAT64, well-known prefix
    ipaddress.ip_network("64:ff9b:1::/48"),  # NAT64, local-use prefix
    ipaddress.ip_network("2002::/16"),  # 6to4
    ipaddress.ip_network("2001::/32"),  # Teredo
    ipaddress.ip_network("::ffff:0:0/96"),  # IPv4-mapped
    ipaddress.ip_network("::/96"),  # IPv4-compatible (deprecated)
]


def resolve(host: str, port: int) -> list[str]:
    """The one DNS lookup of a call (the boundary the DNS-rebinding and slow-DNS tests patch):
    every address is checked, and the connection goes to a checked one, never to a second
    lookup's answer."""
    infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class _LookupsLeftBehind:
    """The lookups this process left behind at their deadline, whose threads still wait for the
    system's resolver (up to about 30 s each). Past TXHUB_CHECK_MAX_ABANDONED_LOOKUPS a new
    lookup is refused at once, so hung resolvers cannot pile up threads (docs/decisions/0087)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def admit(self, host: str) -> None:
        with self._lock:
            count = self._count
        if count >= settings.TXHUB_CHECK_MAX_ABANDONED_LOOKUPS:
            reason = (
                f"not looked up: {count} lookups that outlasted their deadline are still waiting "
                "in this process (TXHUB_CHECK_MAX_ABANDONED_LOOKUPS)"
            )
            raise LookupUnfinished(host, reason)

    def leave_behind(self, done: threading.Event, counted: threading.Event) -> bool:
        """Counts a lookup the caller stops waiting for; False if it has just finished."""
        with self._lock:
            if done.is_set():
                return False
            counted.set()
            self._count += 1
            return True

    def finish(self, done: threading.Event, counted: threading.Event) -> None:
        """A lookup's thread ends: no longer counted, if it was."""
        with self._lock:
            done.set()
            if counted.is_set():
                self._count -= 1


_LEFT_BEHIND = _LookupsLeftBehind()


def _resolve_within(host: str, port: int, seconds: float) -> list[str]:
    """resolve(), waited on for `seconds` at most: the one bounded lookup of a call and of a
    registration. getaddrinfo is C code that neither the call's timer nor Celery's soft time
    limit can interrupt, so it runs in a thread of its own and a lookup still going at the
    deadline is left behind, to end when the system's resolver gives up (docs/decisions/0083);
    LookupUnfinished then, or at once while too many are left behind (0087). A thread per
    lookup, not a shared pool: one group's hung lookups never queue another group's."""
    _LEFT_BEHIND.admit(host)
    answer: list[list[str]] = []
    failure: list[Exception] = []
    done, counted = threading.Event(), threading.Event()

    def lookup() -> None:
        try:
            answer.append(resolve(host, port))
        except Exception as error:  # handed to the caller, who decides what a failure is
            failure.append(error)
        finally:
            _LEFT_BEHIND.finish(done, counted)

    threading.Thread(target=lookup, name="check-url-lookup", daemon=True).start()
    if not done.wait(max(seconds, 0.0)) and _LEFT_BEHIND.leave_behind(done, counted):
        reason = f"not resolved within TXHUB_CHECK_HTTP_TIMEOUT ({seconds:g} s)"
        raise LookupUnfinished(host, reason)
    if failure:
        raise failure[0]
    return answer[0]


def _address_refused(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if not address.is_global or address.is_multicast:
        return True
    return address.version == 6 and any(address in net for net in TRANSLATED_NETWORKS)


def callback_url_check(url: str, *, within: float | None = None) -> list[str]:
    """Refuses URLs that would let a producer group make txhub call internal services (SSRF):
    private, link-local (cloud metadata), reserved and multicast addresses, and IPv6 forms that
    embed an IPv4 address (NAT64, 6to4, Teredo, mapped, compatible), unless allowed by
    TXHUB_CALLBACK_ALLOWED_HOSTS; http:// unless TXHUB_ALLOW_HTTP_CALLBACKS. Checked at
    registration and again before every call. Returns the checked addresses (the call connects
    to the first). `within`: the lookup's deadline, the call's time left (docs/decisions/0083),
    TXHUB_CHECK_HTTP_TIMEOUT by default (a registration's, 0087); a lookup that takes longer, or
    that the process's bound on lookups left behind refuses, raises LookupUnfinished."""
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise CallbackRefused("A check URL must be http(s)://host/...")
    if parts.scheme == "http" and not settings.TXHUB_ALLOW_HTTP_CALLBACKS:
        raise CallbackRefused(
            "A check URL must be https://: plain http:// is refused "
            "(TXHUB_ALLOW_HTTP_CALLBACKS is off)."
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        deadline = settings.TXHUB_CHECK_HTTP_TIMEOUT if within is None else within
        addresses = _resolve_within(parts.hostname, port, deadline)
    except (OSError, ValueError, UnicodeError):
        raise CallbackRefused(f"The host {parts.hostname!r} does not resolve.") from None
    if not addresses:
        raise CallbackRefused(f"The host {parts.hostname!r} does not resolve.")
    allowed = [
        ipaddress.ip_network(net, strict=False) for net in settings.TXHUB_CALLBACK_ALLOWED_HOSTS
    ]
    for text in addresses:
        address = ipaddress.ip_address(text.split("%")[0])
        if any(address in net for net in allowed):
            continue
        if _address_refused(address):
            raise CallbackRefused(
                f"The check URL resolves to {address}, which is not an allowed address "
                "(private, loopback, link-local, reserved and IPv4-embedding IPv6 ranges are "
                "refused)."
            )
    return addresses


# One check -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckResult:
    answer: str  # COMMIT | ROLLBACK | UNKNOWN
    reached: bool  # an HTTP answer came back (uses the check budget)
    status: int | None
    error: str
    latency_ms: int
    webhook_id: str
    # How the check went when not over HTTP (a producer's Telemetry stream): kept in its op.
    via: dict[str, Any] = field(default_factory=dict)


def check_payload(half: HalfMessage) -> dict[str, Any]:
    body: dict[str, Any] = {
        "transaction_id": str(half.transaction_id),
        "msg_id": half.msg_id,
        "producer_group": half.producer_group.name,
        "topic": half.topic.name,
        "tags": half.tags or None,
        "keys": half.keys,
        "properties": half.properties,
        "born_at": half.born_at.isoformat(),
        "check_times": half.check_times,
    }
    raw = bytes(half.body)
    if half.body_is_binary:
        body["body_base64"] = base64.b64encode(raw).decode()
    else:
        body["body"] = raw.decode()
    return body


# The bounded call ------------------------------------------------------------------------------

# A decision is a few bytes of JSON; anything larger is not one (and is not read further).
MAX_ANSWER_BYTES = 64 * 1024


class _CallFailed(Exception):
    """A call that gave no usable answer in time or within the size cap. `reached`: the
    producer's answer had begun (its status line and headers arrived)."""

    def __init__(self, message: str, *, reached: bool) -> None:
        super().__init__(message)
        self.reached = reached


def _pinned_adapter(address: str, sockets: list[socket.socket]) -> HTTPAdapter:
    """A transport that connects to `address` (the checked one) whatever the URL's host name
    resolves to now, while TLS SNI and the certificate check keep the host name: urllib3
    connects to `_dns_host` and verifies against `server_hostname` (urllib3/connection.py); the
    caller sets the Host header. Every socket it opens is handed to `sockets`, so the call's
    deadline can close it."""

    class PinnedHTTPConnection(HTTPConnection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._dns_host = address

        def _new_conn(self) -> socket.socket:
            sock = super()._new_conn()
            sockets.append(sock)
            return sock

    class PinnedHTTPSConnection(HTTPSConnection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # SNI and the certificate check name the URL's host, not the address.
            self.server_hostname = self.server_hostname or self.host
            self._dns_host = address

        def _new_conn(self) -> socket.socket:
            sock = super()._new_conn()
            sockets.append(sock)
            return sock

    class PinnedHTTPPool(HTTPConnectionPool):
        ConnectionCls = PinnedHTTPConnection

    class PinnedHTTPSPool(HTTPSConnectionPool):
        ConnectionCls = PinnedHTTPSConnection

    class PinnedAdapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = {
                "http": PinnedHTTPPool,
                "https": PinnedHTTPSPool,
            }

    return PinnedAdapter(max_retries=0)


def bounded_post(url: str, *, data: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """POSTs with TXHUB_CHECK_HTTP_TIMEOUT bounding the whole call, host name lookup to last byte
    (a per-read timeout lets an endpoint dripping a byte a second hold a worker forever): the
    lookup is waited on only until the deadline (docs/decisions/0083), then a timer shuts the
    sockets at the deadline, which ends any read in progress. The answer is read up to
    MAX_ANSWER_BYTES; no redirects, no proxies or .netrc from the environment, no compression.
    Returns (status, body); a non-200 answer's body is not read."""
    timeout = settings.TXHUB_CHECK_HTTP_TIMEOUT
    deadline = time.monotonic() + timeout
    try:
        addresses = callback_url_check(url, within=timeout)
    except LookupUnfinished as error:  # no answer: an unreachable check (docs/decisions/0083)
        raise _CallFailed(f"the host name was {error.reason}", reached=False) from None
    # What the lookup left of the deadline bounds the rest of the call.
    left = deadline - time.monotonic()
    if left <= 0:
        raise _CallFailed(_deadline_text(timeout), reached=False)
    host_header = urlsplit(url).netloc.rpartition("@")[2]
    sockets: list[socket.socket] = []
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        for sock in list(sockets):
            with contextlib.suppress(OSError):  # already closed: nothing left to interrupt
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(left, expire)
    timer.daemon = True
    with requests.Session() as session:
        session.trust_env = False  # no proxy or credentials taken from the worker's environment
        session.mount("http://", _pinned_adapter(addresses[0], sockets))
        session.mount("https://", _pinned_adapter(addresses[0], sockets))
        timer.start()
        try:
            if failpoints.ARMED:
                failpoints.hit("during_check_call")
            response = session.post(
                url,
                data=data,
                # The URL's host, not the pinned address the connection goes to.
                headers={**headers, "Host": host_header, "Accept-Encoding": "identity"},
                timeout=(left, left),
                allow_redirects=False,
                stream=True,
            )
            with response:
                if response.status_code != 200:
                    return response.status_code, b""
                body = bytearray()
                for chunk in response.raw.stream(8192, decode_content=False):
                    body += chunk
                    if len(body) > MAX_ANSWER_BYTES:
                        message = f"the answer is larger than {MAX_ANSWER_BYTES} bytes"
                        raise _CallFailed(message, reached=True)
                    if time.monotonic() > deadline:
                        raise _CallFailed(_deadline_text(timeout), reached=True)
                if expired.is_set():  # the timer cut the answer short: what came is not it
                    raise _CallFailed(_deadline_text(timeout), reached=True)
                if response.headers.get("Content-Encoding", "identity") != "identity":
                    raise _CallFailed("the answer is compressed (identity was asked)", reached=True)
                return response.status_code, bytes(body)
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
            # The total deadline, whether the timer or a socket's own timeout saw it first.
            timed_out = (requests.Timeout, urllib3.exceptions.TimeoutError, TimeoutError)
            if expired.is_set() or isinstance(error, timed_out):
                reached = "response" in locals()
                raise _CallFailed(_deadline_text(timeout), reached=reached) from None
            raise
        finally:
            timer.cancel()


def _deadline_text(timeout: float) -> str:
    return f"no complete answer within TXHUB_CHECK_HTTP_TIMEOUT ({timeout:g} s)"


def parse_answer(status: int, body: bytes) -> tuple[str, str]:
    """(answer, error). Only a 200 with a known state is a decision; anything else is UNKNOWN."""
    if status != 200:
        return "UNKNOWN", f"HTTP {status}"
    try:
        state = json.loads(body).get("state")
    except (ValueError, AttributeError, RecursionError):
        return "UNKNOWN", "the answer is not a JSON object"
    if not isinstance(state, str) or state not in ANSWERS:
        return "UNKNOWN", f"unknown state {str(state)[:40]!r}"
    return ANSWERS[state], ""


def call_check_url(half: HalfMessage) -> CheckResult:
    """POSTs the check, signed; never follows redirects; any failure is UNKNOWN, not a decision."""
    return _post_signed(half.producer_group, check_payload(half))


def checkback_test(*, group: ProducerGroup) -> CheckResult:
    """The console's "test callback": a signed check for a transaction that does not exist.

    A listener that works answers UNKNOWN (or ROLLBACK) for it; nothing is recorded or applied.
    The payload says `"test": true` so a producer can tell it apart.
    """
    payload: dict[str, Any] = {
        "transaction_id": str(uuid.uuid4()),
        "msg_id": "TEST",
        "producer_group": group.name,
        "topic": "",
        "tags": None,
        "keys": [],
        "properties": {},
        "born_at": timezone.now().isoformat(),
        "check_times": 0,
        "body": "",
        "test": True,
    }
    return _post_signed(group, payload)


def _post_signed(group: ProducerGroup, payload: dict[str, Any]) -> CheckResult:
    webhook_id = f"msg_{uuid.uuid4().hex}"
    raw = json.dumps(payload, separators=(",", ":")).encode()
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(
            signature(key, webhook_id, timestamp, raw) for key in signing_secrets(group)
        ),
    }
    started = time.monotonic()
    try:
        status, body = bounded_post(group.check_url, data=raw, headers=headers)
    except _CallFailed as error:
        # No usable answer: recorded as an error, never a decision.
        latency = int((time.monotonic() - started) * 1000)
        return CheckResult("UNKNOWN", error.reached, None, str(error), latency, webhook_id)
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
        latency = int((time.monotonic() - started) * 1000)
        return CheckResult("UNKNOWN", False, None, type(error).__name__, latency, webhook_id)
    except CallbackRefused as error:
        latency = int((time.monotonic() - started) * 1000)
        return CheckResult("UNKNOWN", False, None, error.message, latency, webhook_id)
    except SoftTimeLimitExceeded:
        # The check task's soft time limit (checkback.check_soft_time_limit), the backstop
        # should anything in the call outlast its own deadline: no answer, so recorded as an
        # unreachable attempt, which backs off (docs/decisions/0083).
        latency = int((time.monotonic() - started) * 1000)
        error_text = "the check task's soft time limit ended the call"
        return CheckResult("UNKNOWN", False, None, error_text, latency, webhook_id)
    latency = int((time.monotonic() - started) * 1000)
    answer, error_text = parse_answer(status, body)
    return CheckResult(answer, True, status, error_text, latency, webhook_id)


def new_signing_secret() -> str:
    # Standard Webhooks: "whsec_" + base64 of 32 random key bytes.
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
