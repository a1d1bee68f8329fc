"""The producer's side of check-back: verify txhub's Standard Webhooks signature, ask the
listener, answer {"state": "COMMIT" | "ROLLBACK" | "UNKNOWN"}. As a WSGI app or a Django view."""

import base64
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from txhub_client.producer import LocalTransactionState, Message, TransactionListener

logger = logging.getLogger(__name__)
DEFAULT_TOLERANCE = 300  # seconds between txhub's timestamp and our clock (replay protection)


class InvalidSignature(Exception):
    pass


def verify_signature(
    secrets: str | Iterable[str],
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance: int = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> None:
    """Raises InvalidSignature unless one `v1,` signature matches one of the secrets and the
    timestamp is within `tolerance` seconds."""
    lower = {k.lower(): v for k, v in headers.items()}
    try:
        webhook_id, timestamp = lower["webhook-id"], int(lower["webhook-timestamp"])
        signatures = lower["webhook-signature"].split(" ")
    except (KeyError, ValueError):
        raise InvalidSignature("missing or malformed webhook headers") from None
    if abs((now or time.time()) - timestamp) > tolerance:
        raise InvalidSignature("timestamp outside the tolerance")
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    for secret in [secrets] if isinstance(secrets, str) else secrets:
        key = base64.b64decode(secret.removeprefix("whsec_"))
        expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        for candidate in signatures:
            version, _, value = candidate.partition(",")
            if version == "v1" and hmac.compare_digest(value, expected):
                return
    raise InvalidSignature("no signature matches")


def message_from_check(payload: dict[str, Any]) -> Message:
    body: str | bytes = (
        payload["body"] if "body" in payload else base64.b64decode(payload["body_base64"])
    )
    return Message(
        topic=payload["topic"],
        body=body,
        tags=payload.get("tags"),
        keys=payload.get("keys") or [],
        properties=payload.get("properties") or {},
        msg_id=payload["msg_id"],
        transaction_id=payload["transaction_id"],
    )


def answer_check(
    listener: TransactionListener,
    secrets: str | Iterable[str],
    headers: Mapping[str, str],
    body: bytes,
    tolerance: int = DEFAULT_TOLERANCE,
) -> tuple[int, dict[str, str]]:
    """(HTTP status, JSON answer) for one check request."""
    try:
        verify_signature(secrets, headers, body, tolerance=tolerance)
    except InvalidSignature as error:
        return 401, {"error": str(error)}
    try:
        message = message_from_check(json.loads(body))
    except (ValueError, KeyError, TypeError):
        return 400, {"error": "not a txhub check"}
    try:
        state = listener.check_local_transaction(message)
    except Exception:  # noqa: BLE001 - an error is UNKNOWN: txhub asks again later
        logger.exception("check_local_transaction failed for %s", message.transaction_id)
        state = LocalTransactionState.UNKNOW
    return 200, {"state": LocalTransactionState(state).value}


class CheckbackApp:
    """A WSGI app answering txhub's check-back: `CheckbackApp(listener, secret)`."""

    def __init__(
        self,
        listener: TransactionListener,
        secrets: str | Iterable[str],
        *,
        tolerance: int = DEFAULT_TOLERANCE,
    ) -> None:
        self.listener = listener
        self.secrets = [secrets] if isinstance(secrets, str) else list(secrets)
        self.tolerance = tolerance

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if environ.get("REQUEST_METHOD") != "POST":
            start_response("405 Method Not Allowed", [("Content-Type", "application/json")])
            return [b'{"error": "POST only"}']
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length)
        headers = {
            k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")
        }
        status, answer = answer_check(self.listener, self.secrets, headers, body, self.tolerance)
        reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized"}[status]
        start_response(f"{status} {reason}", [("Content-Type", "application/json")])
        return [json.dumps(answer).encode()]


def django_check_view(
    listener: TransactionListener,
    secrets: str | Iterable[str],
    *,
    tolerance: int = DEFAULT_TOLERANCE,
) -> Callable[..., Any]:
    """A Django view for txhub's check-back: `path("txhub/check", django_check_view(...))`."""
    from django.http import HttpRequest, JsonResponse
    from django.views.decorators.csrf import csrf_exempt
    from django.views.decorators.http import require_POST

    @csrf_exempt
    @require_POST
    def view(request: HttpRequest) -> JsonResponse:
        status, answer = answer_check(listener, secrets, request.headers, request.body, tolerance)
        return JsonResponse(answer, status=status)

    return view
