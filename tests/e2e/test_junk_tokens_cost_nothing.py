"""Bad bearer tokens are cheap to refuse (issue 24, item 6; docs/decisions/0038), through a real
server on a Postgres of the test's own: a junk token refused once is refused again without any
lookup (it answers 401 while Postgres is down, where a lookup would answer 503), and past its
failed authentications an address's unknown tokens get 429 before any lookup, while a token
the process knows as good is still served."""

import os
import secrets
import signal
from typing import Any

import pytest
import requests

from apps.broker.api.errors import retry_after_seconds

pytestmark = pytest.mark.e2e


def test_junk_tokens_are_refused_without_lookups_and_throttled_per_address(
    private_cluster: Any,
) -> None:
    cluster = private_cluster
    good = cluster.manage("create_token", "junk-test", "--scope", "admin").strip()
    cluster.web_start(TXHUB_AUTH_FAILURES_PER_MINUTE="5")
    topics = f"{cluster.base}/api/v1/topics"

    def get(token: str) -> int:
        answer = requests.get(topics, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        # Refused on the event loop or not, an answer says its length (never chunked).
        assert answer.headers.get("Content-Length") == str(len(answer.content)), answer.headers
        return int(answer.status_code)

    def junk() -> str:
        return "txh_" + secrets.token_urlsafe(32)

    try:
        assert get(good) == 200  # now known as good in the (one) web process
        repeated = junk()
        assert get(repeated) == 401
        cluster.pg_stop("fast")
        try:
            assert get(repeated) == 401  # remembered: no lookup
            assert get(junk()) == 503  # the positive control: a new one needs Postgres
        finally:
            cluster.pg_start()
        assert [get(junk()) for _ in range(4)] == [401] * 4  # 5 failures: the budget
        cluster.pg_stop("fast")
        try:
            throttled = requests.get(
                topics, headers={"Authorization": f"Bearer {junk()}"}, timeout=30
            )
            assert throttled.status_code == 429  # before any lookup: not 503
            assert throttled.json()["error"]["code"] == "throttled"
            assert int(throttled.headers["Retry-After"]) >= 1
            assert throttled.headers["Content-Length"] == str(len(throttled.content))
        finally:
            cluster.pg_start()
        assert get(good) == 200  # the good token from the same address is served
    finally:
        os.killpg(cluster.web.pid, signal.SIGTERM)
        cluster.web.wait(timeout=30)
        cluster.web = None


@pytest.mark.parametrize(
    ("wait", "seconds"), [(None, 1), (0.0, 1), (0.2, 1), (1.0, 1), (59.01, 60), (59.99, 60)]
)
def test_retry_after_is_whole_seconds_rounded_up_and_at_least_one(
    wait: float | None, seconds: int
) -> None:
    assert retry_after_seconds(wait) == seconds
