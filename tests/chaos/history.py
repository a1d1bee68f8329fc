"""The history of a chaos run, Jepsen style: every client operation is logged when it is invoked
and when it completes, as `ok` (it happened), `fail` (it certainly did not happen) or `info` (the
outcome is unknown: a timeout, a reset connection, a 5xx)."""

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import requests
from urllib3.exceptions import NewConnectionError


@dataclass
class Op:
    index: int
    process: str  # p0.. producers, c0.. consumers
    f: str  # send | prepare | commit | rollback | receive | ack
    value: dict[str, Any]
    invoked: float  # time.monotonic()
    type: str = "invoke"  # invoke -> ok | fail | info
    completed: float | None = None
    result: dict[str, Any] = field(default_factory=dict)


class History:
    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._lock = threading.Lock()

    def invoke(self, process: str, f: str, value: dict[str, Any]) -> Op:
        with self._lock:
            op = Op(len(self.ops), process, f, value, time.monotonic())
            self.ops.append(op)
        return op

    def complete(self, op: Op, type_: str, result: dict[str, Any]) -> Op:
        op.type, op.completed, op.result = type_, time.monotonic(), result
        return op

    def of(self, *functions: str) -> list[Op]:
        with self._lock:
            return [op for op in self.ops if op.f in functions]

    def dump(self, path: Path) -> None:
        with path.open("w") as out:
            for op in list(self.ops):
                out.write(json.dumps(asdict(op)) + "\n")


def call(
    session: requests.Session,
    history: History,
    process: str,
    f: str,
    url: str,
    payload: dict[str, Any],
    *,
    value: dict[str, Any],
    headers: dict[str, str],
    timeout: float = 5,
) -> Op:
    """One HTTP call, logged. 2xx: ok. 4xx: fail (refused; nothing happened). A refused connection:
    fail. Anything after the request may have reached the server (timeout, reset, 5xx): info."""
    op = history.invoke(process, f, value)
    try:
        response = session.post(url, json=payload, headers=headers, timeout=timeout)
    except requests.ConnectTimeout:
        return history.complete(op, "fail", {"error": "connect timeout"})
    except requests.ConnectionError as error:
        reason = getattr(error.args[0], "reason", None) if error.args else None
        if isinstance(reason, NewConnectionError):
            return history.complete(op, "fail", {"error": "connection refused"})
        return history.complete(op, "info", {"error": type(error).__name__})
    except requests.RequestException as error:
        return history.complete(op, "info", {"error": type(error).__name__})
    result: dict[str, Any] = {"status": response.status_code}
    if response.headers.get("Idempotent-Replayed") == "true":
        result["replayed"] = True
    try:
        result["body"] = response.json()
    except ValueError:
        result["body"] = None
        result["raw"] = response.text[:200]
    if 200 <= response.status_code < 300:
        return history.complete(op, "ok", result)
    if 400 <= response.status_code < 500:
        return history.complete(op, "fail", result)
    return history.complete(op, "info", result)
