"""A small JSON client for txhub's API and its error format."""

import json
import time
from typing import Any

import requests

# Worth retrying with the same Idempotency-Key: the request may not have been stored.
RETRYABLE = (requests.ConnectionError, requests.Timeout)


class TxhubError(Exception):
    """An error answer from txhub: {"error": {"code", "message", "details"}}."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any]) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details


class Api:
    def __init__(self, url: str, token: str, *, timeout: float = 30) -> None:
        self.base = url.rstrip("/") + "/api/v1"
        self.timeout = timeout
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
        retries: int = 0,
        repeatable: bool = False,
    ) -> dict[str, Any]:
        """One call; with an Idempotency-Key, retried up to `retries` times (0.2 s, 0.4 s, ...)
        on connection errors, timeouts and 503: txhub answers a retry of a stored request with
        the first answer, so a retry never stores twice. `repeatable` calls (a commit or a
        rollback: a repeat answers the first resolution) are retried without a key."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        for attempt in range(retries + 1):
            last = attempt == retries or not (idempotency_key or repeatable)
            try:
                return self._call(method, path, payload, timeout, headers)
            except RETRYABLE:
                if last:
                    raise
            except TxhubError as error:
                if last or error.status != 503:
                    raise
            time.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

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
            )
        return dict(response.json()) if response.content else {}
