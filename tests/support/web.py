"""The web server's command line, as scripts/run.sh starts it, for every test that starts one."""

import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def web_command(port: int, *, workers: int, graceful_timeout: int = 30) -> list[str]:
    """gunicorn with uvicorn workers (docs/decisions/0024), the application loaded once in the
    arbiter and forked into its workers (docs/decisions/0061)."""
    return [
        str(BIN / "gunicorn"),
        "txhub.asgi:application",
        "--bind",
        f"127.0.0.1:{port}",
        "--worker-class",
        "txhub.worker.TxhubWorker",
        "--workers",
        str(workers),
        "--graceful-timeout",
        str(graceful_timeout),
        "--preload",
    ]
