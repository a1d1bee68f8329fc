"""The tests' /metrics token: /metrics is closed without one (docs/decisions/0090).
tests/conftest.py gives it to this process's settings and, through the environment, to every
server a test starts; a scraper sends METRICS_HEADERS."""

import os

METRICS_TOKEN = os.environ.get("TXHUB_METRICS_TOKEN") or "test-metrics-token"
METRICS_HEADERS = {"Authorization": f"Bearer {METRICS_TOKEN}"}
