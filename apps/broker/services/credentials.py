"""RocketMQ credentials (access key, secret key) of an API token, for the gRPC door.

The secret key is never stored: it is HMAC-SHA256(server key, access key). A copy of the database
alone (a backup, a leaked dump) holds access keys but no secret, and the gRPC door recomputes the
secret to check a signature. docs/decisions/0022.
"""

import base64
import hashlib
import hmac
import secrets
from datetime import UTC, datetime

from django.conf import settings
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


def signature_valid(*, access_key: str, date_time: str, signature: str) -> bool:
    """Whether `signature` is the access key's secret key's signature of `date_time` (no I/O:
    which token the access key is, and whether it is live, is the access module's question)."""
    expected = signature_of(secret_key=secret_key_for(access_key), date_time=date_time)
    return hmac.compare_digest(expected, signature.lower())
