"""A long poll whose database becomes unreachable while it waits answers 503 `unavailable` with
Retry-After, as every 503 does (docs/decisions/0078, 0086): the tries of a wait run outside
DRF (apps/broker/api/long_poll.py) and keep the API exception handler's headers. At both doors
that take a receive (the lean door, and Django's).

The server reaches Postgres through a proxy of the test's own (tests/support/statement_faults.py)
and only through it: the proxy stops accepting and cuts every connection through it, as a crash
of the database's machine or a partition does. The hub's LISTEN connection breaks, which wakes
the waiter; its try finds no database. The shared services are never stopped."""

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from django.conf import settings

from apps.broker.services import registry
from tests.conftest import start_gunicorn
from tests.support.listening import hub_listening
from tests.support.ports import free_port
from tests.support.statement_faults import CuttingProxy

pytestmark = pytest.mark.e2e

WAIT_SECONDS = 20
POOL_TIMEOUT = 2.0  # s: TXHUB_DB_POOL_TIMEOUT of the server, how long it tries to reconnect
MARGIN = 5.0  # s: the hub noticing the cut, the fallback period, a busy machine
# application_name of the server's connections, and so of its LISTEN connection.
WEB_APP = "txhub-web-db-lost"
LISTEN_APP = f"{WEB_APP}-wakeups"


@pytest.fixture(params=["lean", "django"])
def web(
    request: pytest.FixtureRequest, transactional_db: None
) -> Iterator[tuple[int, dict[str, str], CuttingProxy]]:
    registry.topic_create(name="idle", queues=1)
    registry.consumer_group_create(name="billing", max_delivery_attempts=16, consume_from="first")
    _, raw = registry.token_create(name="consumer", scopes=["consume:billing"])
    db = settings.DATABASES["default"]
    proxy = CuttingProxy((db["HOST"], int(db["PORT"])))
    port = free_port()
    env = {
        "TXHUB_LEAN_DOOR": "1" if request.param == "lean" else "0",
        "DATABASE_URL": (
            f"postgres://{db['USER']}@127.0.0.1:{proxy.port}/{db['NAME']}"
            f"?application_name={WEB_APP}&connect_timeout=2"
        ),
        "TXHUB_DB_POOL_TIMEOUT": str(POOL_TIMEOUT),
    }
    process = start_gunicorn(port, workers=1, extra_env=env)
    try:
        yield port, {"Authorization": f"Bearer {raw}"}, proxy
    finally:
        process.terminate()
        process.wait(timeout=60)
        proxy.close()


def test_a_long_poll_whose_database_is_lost_while_it_waits_answers_503_with_retry_after(
    web: Any,
) -> None:
    port, headers, proxy = web
    got: list[tuple[int, Any, Any, float]] = []

    def wait() -> None:
        answer = requests.post(
            f"http://127.0.0.1:{port}/api/v1/consumer-groups/billing/receive",
            headers=headers,
            json={"topic": "idle", "wait_seconds": WAIT_SECONDS},
            timeout=WAIT_SECONDS + 20,
        )
        got.append((answer.status_code, answer.headers, answer.json(), time.monotonic()))

    waiter = threading.Thread(target=wait)
    waiter.start()
    hub_listening(LISTEN_APP)  # the receive found nothing and waits on the hub
    assert not got
    lost = time.monotonic()
    proxy.close()  # no new connection to the database
    proxy.cut()  # and none of the open ones (the pool's, the LISTEN one) works
    waiter.join(WAIT_SECONDS + 30)
    [(status, answer_headers, body, answered)] = got
    assert status == 503, body
    assert body["error"]["code"] == "unavailable"
    assert answer_headers["Retry-After"] == "1"  # as every 503 (docs/decisions/0086)
    # Told while it waited, not when its wait ran out.
    assert answered - lost < POOL_TIMEOUT + MARGIN, f"answered {answered - lost:.1f} s later"
