"""RocketMQ credentials (access key, secret key) of an API token, for the gRPC door.

The secret key is never stored: it is HMAC-SHA256(server key, access key). A copy of the database
alone (a backup, a leaked dump) holds access keys but no secret, and the gRPC door recomputes the
secret to check a signature. docs/decisions/0022.
"""

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.broker.models import ApiToken

ACCESS_KEY_PREFIX = "TXAK"
SECRET_KEY_PREFIX = "txsk_"  # noqa: S105 - a public prefix, not a secret


def new_access_key() -> str:
    # Upper-case letters and digits: safe in the client's "Credential=<ak>," header as it is.
    return ACCESS_KEY_PREFIX + secrets.token_hex(10).upper()


def secret_key_for(access_key: str) -> str:
    """The token's RocketMQ secret key: derived, so it can be shown once and never kept."""
    server_key = settings.TXHUB_CREDENTIALS_KEY.encode()
    # A label keeps this derivation apart from any other use of the same server key.
    mac = hmac.new(server_key, b"txhub-rocketmq-secret-key:" + access_key.encode(), hashlib.sha256)
    return SECRET_KEY_PREFIX + base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")


def signature_of(*, secret_key: str, date_time: str) -> str:
    """RocketMQ 5's MQv2-HMAC-SHA1: hex HMAC-SHA1(secret key, the x-mq-date-time header)."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def of(token: ApiToken) -> dict[str, str]:
    """The token's RocketMQ credentials as shown once at its creation (API, console, command)."""
    access_key = token.access_key or ""
    return {"access_key": access_key, "secret_key": secret_key_for(access_key)}


@dataclass(frozen=True)
class Principal:
    """Whom a signed gRPC request comes from: the token's id, name and scopes."""

    token_id: int
    name: str
    scopes: frozenset[str]


def signed_recently(date_time: str) -> bool:
    """Whether a signature's `x-mq-date-time` (yyyyMMdd'T'HHmmss'Z', UTC) is within
    TXHUB_GRPC_SIGNATURE_MAX_SKEW_SECONDS of now: a captured signed header stops working after
    that long (docs/decisions/0035)."""
    skew = float(settings.TXHUB_GRPC_SIGNATURE_MAX_SKEW_SECONDS)
    if skew <= 0:
        return True
    try:
        signed_at = datetime.strptime(date_time, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return False
    return abs((timezone.now() - signed_at).total_seconds()) <= skew


def principal_for(*, access_key: str, date_time: str, signature: str) -> Principal | None:
    """The token whose access key signed this, or None (unknown, revoked or a bad signature).

    Read on every call, as REST reads its bearer token: a revoked token fails at once, in every
    gRPC process."""
    expected = signature_of(secret_key=secret_key_for(access_key), date_time=date_time)
    if not hmac.compare_digest(expected, signature.lower()):
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, name, scopes FROM broker_apitoken "
            "WHERE access_key = %s AND (revoked_at IS NULL OR revoked_at > %s)",
            [access_key, timezone.now()],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    scopes = row[2] if isinstance(row[2], list) else json.loads(row[2])
    return Principal(int(row[0]), str(row[1]), frozenset(str(s) for s in scopes))
