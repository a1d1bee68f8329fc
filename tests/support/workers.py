"""What each pytest-xdist worker keeps to itself (docs/decisions/0051).

`make test` runs the suite in a few worker processes at once. Each has its own test database
(pytest-django names it test_txhub_gw0, test_txhub_gw1, ...), and this module gives each its own
Redis databases and log files, so that one worker's Celery purge, cache epoch or log never
reaches another's, nor the `make run` beside them (which owns Redis databases 0 and 3).
"""

import os
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[2]
REDIS_PORT = os.environ.get("TXHUB_REDIS_PORT", "63799")

# "gw0", "gw1", ... under xdist; "" in a plain pytest run.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")

Role = Literal["celery", "cache", "spare"]
_OFFSET: dict[Role, int] = {"celery": 0, "cache": 1, "spare": 2}
# A plain run keeps the databases it always used; worker N takes three of its own from 5 on
# (scripts/services.sh gives Redis 32 databases, so at most nine workers).
_PLAIN: dict[Role, int] = {"celery": 1, "cache": 4, "spare": 2}
MAX_WORKERS = 9


def redis_db(role: Role) -> int:
    if not WORKER:
        return _PLAIN[role]
    index = int(WORKER.removeprefix("gw"))
    if index >= MAX_WORKERS:
        raise RuntimeError(f"at most {MAX_WORKERS} xdist workers: Redis has 32 databases")
    return 5 + 3 * index + _OFFSET[role]


def redis_url(role: Role) -> str:
    return f"redis://127.0.0.1:{REDIS_PORT}/{redis_db(role)}"


def log_path(name: str) -> Path:
    """var/<name>, with this worker's id before the suffix (var/test-grpc-gw1.log)."""
    path = ROOT / "var" / name
    return path.with_name(f"{path.stem}-{WORKER}{path.suffix}") if WORKER else path
