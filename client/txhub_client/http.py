"""A small JSON client for txhub's API and its error format."""

from typing import Any

import requests


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
    ) -> dict[str, Any]:
        response = self.session.request(
            method, self.base + path, json=payload, timeout=timeout or self.timeout
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
