"""A light keep-alive JSON client (http.client) for the benchmarks: the load generator shares
the machine's two cores with the server, so it should spend as little CPU as it can."""

import http.client
import json
from typing import Any
from urllib.parse import urlsplit


class Client:
    def __init__(self, base: str, token: str) -> None:
        parts = urlsplit(base)
        self.prefix = parts.path.rstrip("/") or "/api/v1"
        self.conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def post(self, path: str, payload: object = None) -> dict[str, Any]:
        self.conn.request("POST", self.prefix + path, json.dumps(payload or {}), self.headers)
        response = self.conn.getresponse()
        body = response.read()
        if response.status >= 300:
            raise RuntimeError(f"{path}: {response.status} {body[:200]!r}")
        return dict(json.loads(body))
