"""A small JSON client for txhub's API and its error format."""

import email.utils
import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

import requests

logger = logging.getLogger(__name__)

# Worth retrying with the same Idempotency-Key: the request may not have been stored.
RETRYABLE = (requests.ConnectionError, requests.Timeout)
# Refused before anything was stored: 429 (over the token's rate) and 503 (no database).
RETRYABLE_STATUSES = (429, 503)
# A whole call, its retries and their pauses included, ends within this many seconds by default:
# long enough to outlast a Postgres failover, whose 503s last up to ~30 s (docs/decisions/0082).
DEFAULT_RETRY_BUDGET = 60.0
FIRST_BACKOFF = 0.2
MAX_BACKOFF = 5.0


class TxhubError(Exception):
    """An error answer from txhub: {"error": {"code", "message", "details"}}, and its
    Retry-After in seconds when it had one (429, 503)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: dict[str, Any],
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.retry_after = retry_after


def parse_retry_after(value: str | None) -> float | None:
    """RFC 9110's Retry-After: delay-seconds or an HTTP-date; None when absent or unreadable."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


class Api:
    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = 30,
        retry_budget: float = DEFAULT_RETRY_BUDGET,
    ) -> None:
        self.base = url.rstrip("/") + "/api/v1"
        self.timeout = timeout
        self.retry_budget = retry_budget
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def call(
        self,
        method: str,
        path: str,
        payload: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        idempotency_key: str | None = None,
        retries: int | None = 0,
        repeatable: bool = False,
    ) -> dict[str, Any]:
        """One call. Only a call txhub answers the same way when repeated is retried: one with an
        Idempotency-Key (a retry of a stored request gets the first answer, so nothing is stored
        twice) or a `repeatable` one (a commit, a rollback, a recall: a repeat answers the first
        resolution). Those are retried on connection errors, timeouts, 429 and 503, after
        max(Retry-After, backoff) with the backoff doubling from 0.2 s up to 5 s, until the
        call's `retry_budget` seconds are spent (a Retry-After past it is not waited out) or
        `retries` retries were made (None: no limit but the budget; 0: never)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        may_retry = bool(idempotency_key or repeatable) and retries != 0
        deadline = time.monotonic() + self.retry_budget
        attempt = 0
        failure: Exception
        while True:
            try:
                return self._call(method, path, payload, timeout, headers)
            except RETRYABLE as error:
                pause, failure = _backoff(attempt), error
            except TxhubError as error:
                if error.status not in RETRYABLE_STATUSES:
                    raise
                pause, failure = max(error.retry_after or 0.0, _backoff(attempt)), error
            attempt += 1
            out_of_retries = retries is not None and attempt > retries
            if not may_retry or out_of_retries or time.monotonic() + pause > deadline:
                raise failure
            logger.warning(
                "%s %s failed (%s); retry %d in %.1f s", method, path, failure, attempt, pause
            )
            time.sleep(pause)

    def _call(
        self,
        method: str,
        path: str,
        payload: dict[str, Any] | None,
        timeout: float | None,
        headers: dict[str, str] | None,
    ) -> dict[str, Any]:
        # UTF-8 as it is, not \u escapes: txhub caps a request at 8 MiB on the wire, which a
        # 4 MiB text body escaped (up to 6 bytes a character) would pass (docs/decisions/0032).
        data = None if payload is None else json.dumps(payload, ensure_ascii=False).encode()
        response = self.session.request(
            method,
            self.base + path,
            data=data,
            timeout=timeout or self.timeout,
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
            except (ValueError, KeyError, TypeError):
                error = {"code": "http_error", "message": response.text[:200], "details": {}}
            raise TxhubError(
                response.status_code,
                error.get("code", ""),
                error.get("message", ""),
                error.get("details", {}),
                retry_after=parse_retry_after(response.headers.get("Retry-After")),
            )
        return dict(response.json()) if response.content else {}


def _backoff(attempt: int) -> float:
    return float(min(MAX_BACKOFF, FIRST_BACKOFF * 2**attempt))
