"""Check-back: asking the producer what became of a transaction it never resolved.

The scan claims due transactions (a lease in `checking_until`, taken with SKIP LOCKED, committed
at once); a task per transaction calls the producer group's check URL outside any lock; the
answer is applied under the half row's lock only while the transaction is still PREPARED, through
the same commit/rollback services as the producer's own calls (CONTRACT invariant 7).
"""

import base64
import hashlib
import hmac
import ipaddress
import json
import secrets
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.broker import failpoints
from apps.broker.metrics import CHECKBACK_ATTEMPTS, CHECKBACK_LATENCY
from apps.broker.models import HalfMessage, OpKind, OpRecord, ProducerGroup, Resolver
from apps.broker.models import TransactionState as State
from apps.broker.services import transactions
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


def callback_url_check(url: str) -> None:
    """Refuses URLs that would let a producer group make txhub call internal services (SSRF):
    private, link-local (cloud metadata), reserved and multicast addresses, unless allowed by
    TXHUB_CALLBACK_ALLOWED_HOSTS. Checked at registration and again before every call."""
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise CallbackRefused("A check URL must be http(s)://host/...")
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 80, proto=socket.IPPROTO_TCP)
    except OSError:
        raise CallbackRefused(f"The host {parts.hostname!r} does not resolve.") from None
    allowed = [
        ipaddress.ip_network(net, strict=False) for net in settings.TXHUB_CALLBACK_ALLOWED_HOSTS
    ]
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if any(address in net for net in allowed):
            continue
        if not address.is_global or address.is_multicast:
            raise CallbackRefused(
                f"The check URL resolves to {address}, which is not an allowed address "
                "(private, loopback, link-local and reserved ranges are refused)."
            )


# The scan --------------------------------------------------------------------------------------

CLAIM_SQL = """
WITH inflight AS (
    SELECT producer_group_id, count(*) AS n FROM broker_halfmessage
    WHERE state = 'PREPARED' AND checking_until > %(now)s
    GROUP BY producer_group_id
),
due AS (
    SELECT id, producer_group_id, next_check_at FROM broker_halfmessage
    WHERE state = 'PREPARED' AND next_check_at <= %(now)s
    ORDER BY next_check_at LIMIT %(window)s
),
ranked AS (
    SELECT due.id, row_number() OVER (
        PARTITION BY due.producer_group_id ORDER BY due.next_check_at) AS rank,
        coalesce(inflight.n, 0) AS busy
    FROM due LEFT JOIN inflight USING (producer_group_id)
)
UPDATE broker_halfmessage SET checking_until = %(lease)s, next_check_at = %(lease)s
WHERE id IN (
    SELECT h.id FROM broker_halfmessage h JOIN ranked ON ranked.id = h.id
    WHERE ranked.rank + ranked.busy <= %(per_group)s
      AND h.state = 'PREPARED' AND h.next_check_at <= %(now)s
    ORDER BY h.next_check_at LIMIT %(batch)s
    FOR UPDATE OF h SKIP LOCKED
)
RETURNING id
"""


def checkback_claim_due() -> list[int]:
    """Claims due PREPARED transactions for checking, at most N in flight per producer group.

    Lock, SKIP LOCKED: two scans (or a scan racing a commit) never claim the same row; a row being
    resolved right now is skipped and, once resolved, is no longer PREPARED. The claim moves
    next_check_at to the lease's end, so a check whose worker died is due again after the lease.
    """
    now = timezone.now()
    lease = now + timedelta(seconds=settings.TXHUB_CHECK_HTTP_TIMEOUT + 30)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            CLAIM_SQL,
            {
                "now": now,
                "lease": lease,
                "window": settings.TXHUB_CHECK_BATCH * 4,
                "batch": settings.TXHUB_CHECK_BATCH,
                "per_group": settings.TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP,
            },
        )
        return [row[0] for row in cursor.fetchall()]


def checkback_park_stale() -> int:
    """PREPARED for longer than TXHUB_MAX_PENDING_AGE -> PARKED, whatever the checks said."""
    cutoff = timezone.now() - timedelta(seconds=settings.TXHUB_MAX_PENDING_AGE)
    stale = HalfMessage.objects.filter(state=State.PREPARED, born_at__lt=cutoff)
    ids = list(stale.values_list("transaction_id", flat=True)[: settings.TXHUB_CHECK_BATCH])
    for transaction_id in ids:
        transactions.transaction_park(
            transaction_id=transaction_id,
            actor=SYSTEM,
            reason=f"unresolved for longer than TXHUB_MAX_PENDING_AGE "
            f"({settings.TXHUB_MAX_PENDING_AGE:.0f} s)",
        )
    return len(ids)


# One check -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckResult:
    answer: str  # COMMIT | ROLLBACK | UNKNOWN
    reached: bool  # an HTTP answer came back (uses the check budget)
    status: int | None
    error: str
    latency_ms: int
    webhook_id: str


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


def parse_answer(response: requests.Response) -> tuple[str, str]:
    """(answer, error). Only a 200 with a known state is a decision; anything else is UNKNOWN."""
    if response.status_code != 200:
        return "UNKNOWN", f"HTTP {response.status_code}"
    try:
        state = response.json().get("state")
    except (ValueError, AttributeError):
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
        callback_url_check(group.check_url)
        response = requests.post(
            group.check_url,
            data=raw,
            headers=headers,
            timeout=settings.TXHUB_CHECK_HTTP_TIMEOUT,
            allow_redirects=False,
        )
    except (requests.RequestException, CallbackRefused) as error:
        latency = int((time.monotonic() - started) * 1000)
        message = error.message if isinstance(error, CallbackRefused) else type(error).__name__
        return CheckResult("UNKNOWN", False, None, message, latency, webhook_id)
    latency = int((time.monotonic() - started) * 1000)
    answer, error_text = parse_answer(response)
    return CheckResult(answer, True, response.status_code, error_text, latency, webhook_id)


def checkback_run(*, half_id: int) -> str:
    """One check of one claimed transaction. Returns what happened, for logs and tests."""
    half = HalfMessage.objects.select_related("producer_group", "topic").filter(pk=half_id).first()
    if half is None or half.state != State.PREPARED:
        # Resolved since the claim: never send a check for it (invariant 7).
        HalfMessage.objects.filter(pk=half_id).update(checking_until=None)
        return "skipped"
    result = call_check_url(half)
    if failpoints.ARMED:
        failpoints.hit("after_check_answer_before_write")
    return checkback_apply(half_id=half_id, result=result)


def checkback_apply(*, half_id: int, result: CheckResult) -> str:
    now = timezone.now()
    detail = {
        "answer": result.answer,
        "reached": result.reached,
        "status": result.status,
        "error": result.error,
        "latency_ms": result.latency_ms,
        "webhook_id": result.webhook_id,
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
            _record_check(half, {**detail, "applied": False}, now)
            HalfMessage.objects.filter(pk=half_id).update(checking_until=None)
            return "resolved-meanwhile"
        _record_check(half, {**detail, "applied": result.answer != "UNKNOWN"}, now)
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


def _record_check(half: HalfMessage, detail: dict[str, Any], now: Any) -> None:
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
