"""Check-back: asking the producer what became of a transaction it never resolved.

The scan claims due transactions (a lease in `checking_until`, taken with SKIP LOCKED, committed
at once); a task per transaction calls the producer group's check URL outside any lock; the
answer is applied under the half row's lock only while the transaction is still PREPARED, through
the same commit/rollback services as the producer's own calls (CONTRACT invariant 7).
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
from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Now
from django.utils import timezone
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from apps.broker import failpoints
from apps.broker.clock import db_now
from apps.broker.metrics import CHECKBACK_ATTEMPTS, CHECKBACK_LATENCY
from apps.broker.models import HalfMessage, OpKind, OpRecord, ProducerGroup, Resolver
from apps.broker.models import TransactionState as State
from apps.broker.services import checkback_stream, scans, transactions
from apps.broker.services.errors import CallbackRefused
from apps.broker.services.transactions import Actor

CHECK_BACK = Actor(Resolver.CHECK_BACK, "check-back")
SYSTEM = Actor(Resolver.SYSTEM, "txhub")

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
    """The one DNS lookup of a call (the boundary the DNS-rebinding test patches): every address
    is checked, and the connection goes to a checked one, never to a second lookup's answer."""
    infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _address_refused(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if not address.is_global or address.is_multicast:
        return True
    return address.version == 6 and any(address in net for net in TRANSLATED_NETWORKS)


def callback_url_check(url: str) -> list[str]:
    """Refuses URLs that would let a producer group make txhub call internal services (SSRF):
    private, link-local (cloud metadata), reserved and multicast addresses, and IPv6 forms that
    embed an IPv4 address (NAT64, 6to4, Teredo, mapped, compatible), unless allowed by
    TXHUB_CALLBACK_ALLOWED_HOSTS; http:// unless TXHUB_ALLOW_HTTP_CALLBACKS. Checked at
    registration and again before every call. Returns the checked addresses (the call connects
    to the first)."""
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
        addresses = resolve(parts.hostname, port)
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


# The scan --------------------------------------------------------------------------------------

CLAIM_SQL = """
WITH inflight AS (
    SELECT producer_group_id, count(*) AS n FROM broker_halfmessage
    WHERE state = 'PREPARED' AND checking_until > statement_timestamp()
    GROUP BY producer_group_id
),
due AS (
    SELECT id, producer_group_id, next_check_at FROM broker_halfmessage
    WHERE state = 'PREPARED' AND next_check_at <= statement_timestamp()
      AND (%(group)s::bigint IS NULL OR producer_group_id = %(group)s::bigint)
    ORDER BY next_check_at LIMIT %(window)s
),
ranked AS (
    SELECT due.id, row_number() OVER (
        PARTITION BY due.producer_group_id ORDER BY due.next_check_at) AS rank,
        coalesce(inflight.n, 0) AS busy
    FROM due LEFT JOIN inflight USING (producer_group_id)
)
UPDATE broker_halfmessage
SET checking_until = statement_timestamp() + make_interval(secs => %(lease)s),
    next_check_at = statement_timestamp() + make_interval(secs => %(lease)s)
WHERE id IN (
    SELECT h.id FROM broker_halfmessage h JOIN ranked ON ranked.id = h.id
    WHERE ranked.rank + ranked.busy <= %(per_group)s
      AND h.state = 'PREPARED' AND h.next_check_at <= statement_timestamp()
    ORDER BY h.next_check_at LIMIT %(batch)s
    FOR UPDATE OF h SKIP LOCKED
)
RETURNING id
"""


def checkback_claim_due(*, producer_group_id: int | None = None) -> list[int]:
    """Claims due PREPARED transactions for checking, at most N in flight per producer group
    (only that group's with `producer_group_id`).

    Lock, SKIP LOCKED: two scans (or a scan racing a commit) never claim the same row; a row being
    resolved right now is skipped and, once resolved, is no longer PREPARED. The claim moves
    next_check_at to the lease's end, so a check whose worker died is due again after the lease.
    """
    # The database clock throughout (apps/broker/clock.py): a worker's own clock never decides.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            CLAIM_SQL,
            {
                "lease": settings.TXHUB_CHECK_HTTP_TIMEOUT + 30,
                "window": settings.TXHUB_CHECK_BATCH * 4,
                "batch": settings.TXHUB_CHECK_BATCH,
                "per_group": settings.TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP,
                "group": producer_group_id,
            },
        )
        return [row[0] for row in cursor.fetchall()]


def checkback_claim_next(*, after: int) -> list[int]:
    """The group's next due checks, claimed when one of its checks ends (`after`, a half id).

    Without this a group's checks advance only once per scan: at most the per-group cap per
    TXHUB_SCAN_SECONDS, so a producer that crashed with a thousand open transactions (or a
    backlog left by checks whose workers died) drains at a couple of checks a second. The freed
    slot is refilled at once instead; the cap and the lease are the scan's."""
    group = HalfMessage.objects.filter(pk=after).values_list("producer_group_id", flat=True)
    for producer_group_id in group:
        return checkback_claim_due(producer_group_id=producer_group_id)
    return []


def checkback_park_stale() -> int:
    """PREPARED for longer than TXHUB_MAX_PENDING_AGE -> PARKED, whatever the checks said.

    Row by row: a row that cannot be read back is logged, counted and skipped (scans.py), and the
    claim that follows in the same scan still runs for every other group."""
    # Postgres' clock, in the query itself (one statement a scan, not two).
    cutoff = Now() - timedelta(seconds=settings.TXHUB_MAX_PENDING_AGE)
    stale = HalfMessage.objects.filter(state=State.PREPARED, born_at__lt=cutoff).exclude(
        pk__in=scans.skipped("checkback_park_stale")
    )
    rows = list(stale.values_list("pk", "transaction_id")[: settings.TXHUB_CHECK_BATCH])
    parked = 0
    for pk, transaction_id in rows:
        try:
            with transaction.atomic():
                transactions.transaction_park(
                    transaction_id=transaction_id,
                    actor=SYSTEM,
                    reason=f"unresolved for longer than TXHUB_MAX_PENDING_AGE "
                    f"({settings.TXHUB_MAX_PENDING_AGE:.0f} s)",
                )
            parked += 1
        except scans.UNREADABLE as error:
            scans.row_failed("checkback_park_stale", pk, error)
    return parked


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
    """POSTs with TXHUB_CHECK_HTTP_TIMEOUT bounding the whole call, connect to last byte (a
    per-read timeout lets an endpoint dripping a byte a second hold a worker forever): a timer
    shuts the sockets at the deadline, which ends any read in progress. The answer is read up to
    MAX_ANSWER_BYTES; no redirects, no proxies or .netrc from the environment, no compression.
    Returns (status, body); a non-200 answer's body is not read."""
    timeout = settings.TXHUB_CHECK_HTTP_TIMEOUT
    deadline = time.monotonic() + timeout
    addresses = callback_url_check(url)
    host_header = urlsplit(url).netloc.rpartition("@")[2]
    sockets: list[socket.socket] = []
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        for sock in list(sockets):
            with contextlib.suppress(OSError):  # already closed: nothing left to interrupt
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    with requests.Session() as session:
        session.trust_env = False  # no proxy or credentials taken from the worker's environment
        session.mount("http://", _pinned_adapter(addresses[0], sockets))
        session.mount("https://", _pinned_adapter(addresses[0], sockets))
        timer.start()
        try:
            response = session.post(
                url,
                data=data,
                # The URL's host, not the pinned address the connection goes to.
                headers={**headers, "Host": host_header, "Accept-Encoding": "identity"},
                timeout=(timeout, timeout),
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
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError):
            if expired.is_set():
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
    latency = int((time.monotonic() - started) * 1000)
    answer, error_text = parse_answer(status, body)
    return CheckResult(answer, True, status, error_text, latency, webhook_id)


def checkback_run(*, half_id: int) -> str:
    """One check of one claimed transaction. Returns what happened, for logs and tests."""
    try:
        half = (
            HalfMessage.objects.select_related("producer_group", "topic").filter(pk=half_id).first()
        )
    except scans.UNREADABLE as error:
        # Unreadable (scans.py): no check can be built for it. Not claimed again for a day, so
        # it is not retried every lease; logged and counted for an operator to repair.
        scans.row_failed("checkback_run", half_id, error)
        HalfMessage.objects.filter(pk=half_id).update(
            checking_until=None, next_check_at=db_now() + timedelta(days=1)
        )
        return "unreadable"
    if half is None or half.state != State.PREPARED:
        # Resolved since the claim: never send a check for it (invariant 7).
        HalfMessage.objects.filter(pk=half_id).update(checking_until=None)
        return "skipped"
    # A RocketMQ producer of the group connected to a gRPC process: asked on its stream, and its
    # answer comes back as EndTransaction (checkback_stream.checkback_answer). Otherwise HTTP.
    with transaction.atomic():
        # Lock: the producer's answer to this check (checkback_stream.checkback_answer) waits
        # until the check's record names the client it was sent to. Held across one Redis
        # PUBLISH (bounded by its socket timeout), never across the HTTP call below.
        HalfMessage.objects.select_for_update(of=("self",)).filter(pk=half_id).first()
        sent_to = checkback_stream.checkback_send(half=half)
        if sent_to is not None:
            result = CheckResult("UNKNOWN", True, None, "", 0, "", via=sent_to)
            return checkback_apply(half_id=half_id, result=result)
    result = call_check_url(half)
    if failpoints.ARMED:
        failpoints.hit("after_check_answer_before_write")
    return checkback_apply(half_id=half_id, result=result)


def checkback_apply(*, half_id: int, result: CheckResult) -> str:
    now = db_now()
    detail = {
        "answer": result.answer,
        "reached": result.reached,
        "status": result.status,
        "error": result.error,
        "latency_ms": result.latency_ms,
        "webhook_id": result.webhook_id,
        **result.via,
    }
    CHECKBACK_ATTEMPTS.labels(result=result.answer if result.reached else "unreachable").inc()
    if result.reached:
        CHECKBACK_LATENCY.observe(result.latency_ms / 1000)
    with transaction.atomic():
        # Lock: a late producer commit/rollback or an operator action on the same transaction
        # waits here (or we wait for it), so the answer applies only while still PREPARED.
        half = HalfMessage.objects.select_for_update(of=("self",)).filter(pk=half_id).first()
        if half is None:
            return "gone"
        if half.state != State.PREPARED:
            record_check(half, {**detail, "applied": False}, now)
            HalfMessage.objects.filter(pk=half_id).update(checking_until=None)
            return "resolved-meanwhile"
        record_check(half, {**detail, "applied": result.answer != "UNKNOWN"}, now)
        half.checking_until = None
        if result.answer in {"COMMIT", "ROLLBACK"}:
            half.check_times += 1
            half.unreachable_checks = 0
            half.save(update_fields=["checking_until", "check_times", "unreachable_checks"])
            resolve = (
                transactions.transaction_commit
                if result.answer == "COMMIT"
                else transactions.transaction_rollback
            )
            resolve(
                transaction_id=half.transaction_id,
                actor=CHECK_BACK,
                reason="answered by the producer's check URL",
            )
            return result.answer
        if result.reached:
            half.check_times += 1
            half.unreachable_checks = 0
            half.next_check_at = now + timedelta(seconds=settings.TXHUB_CHECK_INTERVAL)
        else:
            half.unreachable_checks += 1
            backoff = min(2 ** (half.unreachable_checks - 1), settings.TXHUB_CHECK_MAX_BACKOFF)
            half.next_check_at = now + timedelta(seconds=backoff)
        half.save(
            update_fields=["checking_until", "check_times", "unreachable_checks", "next_check_at"]
        )
        if half.check_times >= settings.TXHUB_CHECK_MAX:
            transactions.transaction_park(
                transaction_id=half.transaction_id,
                actor=SYSTEM,
                reason=f"no decision after {half.check_times} checks (TXHUB_CHECK_MAX)",
            )
            return "parked"
        return "unknown" if result.reached else "unreachable"


def record_check(half: HalfMessage, detail: dict[str, Any], now: Any) -> None:
    """The CHECK op of one check-back attempt, over HTTP or a producer's gRPC stream."""
    OpRecord.objects.create(
        half=half,
        op=OpKind.CHECK,
        source=Resolver.CHECK_BACK,
        actor="check-back",
        reason=detail["error"],
        detail=detail,
        at=now,
    )


def new_signing_secret() -> str:
    # Standard Webhooks: "whsec_" + base64 of 32 random key bytes.
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
