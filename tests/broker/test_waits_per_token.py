"""A token's waiting receives are bounded where no event loop waits for them too (WSGI: the Django
test client, waiting.wait_here; docs/decisions/0084): with TXHUB_MAX_WAITS_PER_TOKEN=1, while one
receive of a token waits, its second receive that would wait is 429 `throttled` with Retry-After;
one that does not wait (wait_seconds 0) and another token's waiting receive are served, and the
token may wait again once its wait has ended."""

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connections
from rest_framework.test import APIClient

from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

HELD_SECONDS = 3


def receive(client: APIClient, wait: float) -> Any:
    try:
        return client.post(
            "/api/v1/consumer-groups/billing/receive",
            {"topic": "orders", "max_messages": 1, "wait_seconds": wait},
            format="json",
        )
    finally:
        if threading.current_thread() is not threading.main_thread():
            connections.close_all()


def test_a_second_wait_of_a_token_at_its_cap_is_429_and_others_still_wait(
    setup_topic: Callable[..., dict[str, Any]],
    make_client: Callable[..., APIClient],
    settings: Any,
) -> None:
    settings.TXHUB_MAX_WAITS_PER_TOKEN = 1
    setup_topic()
    hog, other = make_client("consume:billing"), make_client("consume:billing", name="other")
    with ThreadPoolExecutor(2) as pool:
        # Two waits of the token at once: one holds its one slot, the other is refused at once.
        both = [pool.submit(receive, hog, HELD_SECONDS) for _ in range(2)]
        [done] = wait_until(lambda: [f for f in both if f.done()], timeout=HELD_SECONDS - 1)
        refused = done.result()
        assert refused.status_code == 429, refused.content
        assert refused["Retry-After"] == "1"
        assert refused.json()["error"]["code"] == "throttled"
        [held] = [f for f in both if f is not done]

        assert receive(hog, 0).status_code == 200  # one that does not wait takes no slot
        started = time.monotonic()
        assert receive(other, 1).status_code == 200  # the positive control: it waits
        assert time.monotonic() - started >= 0.9
        assert not held.done(), "the held receive did not wait"
        assert held.result(timeout=HELD_SECONDS + 10).status_code == 200

    started = time.monotonic()
    assert receive(hog, 1).status_code == 200
    assert time.monotonic() - started >= 0.9
