"""Shared fixtures. Everything runs on the real Postgres and Redis that `make test` starts.

- `api`: DRF's test client with an admin token, for behaviour tests (fast, same process).
- `server`: a real gunicorn on the test database, for tests that speak HTTP from many threads.
"""

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.conf import settings
from django.db.backends.signals import connection_created
from rest_framework.test import APIClient

from apps.broker import config_cache
from apps.broker.api import failed_auth
from apps.broker.services import registry
from tests.support.metrics import METRICS_TOKEN
from tests.support.ports import free_port
from tests.support.scheduling import ModuleOrDirectoryScheduling, make_scheduler
from tests.support.web import web_command
from tests.support.workers import log_path, redis_url

# The tests' producers listen on http://127.0.0.1, as `make test` allows (scripts/test.sh): the
# same default when pytest runs directly, for this process (whose settings are already loaded)
# and the gunicorn and Celery processes the tests start. An explicit environment wins.
if "TXHUB_ALLOW_HTTP_CALLBACKS" not in os.environ:
    os.environ["TXHUB_ALLOW_HTTP_CALLBACKS"] = "1"
    settings.TXHUB_ALLOW_HTTP_CALLBACKS = True

# The JVMs the tests start (Spark's driver, a standalone master, worker and executor) run for
# seconds on tiny data: compiled by C1 alone, with one GC thread, they cost half the CPU
# (docs/decisions/0060). An explicit environment wins.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

# This worker's own Redis databases (tests/support/workers.py), for this process and for the
# gunicorn and Celery processes the tests start; set before any cache or broker connection.
# (Not CELERY_BROKER_URL in this process's environment: Celery would prefer it to the broker a
# test's own Celery app names; the processes started below are given it one by one.)
os.environ["TXHUB_CACHE_URL"] = redis_url("cache")
settings.TXHUB_CACHE_URL = settings.CACHES["default"]["LOCATION"] = redis_url("cache")
settings.CELERY_BROKER_URL = redis_url("celery")

# /metrics is closed without a token (docs/decisions/0090): one for this process and for the
# gunicorn processes the tests start, which their scrapers send (tests/support/metrics.py).
os.environ["TXHUB_METRICS_TOKEN"] = settings.TXHUB_METRICS_TOKEN = METRICS_TOKEN


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow modules first (keeping every other order): with the suite spread over a few
    processes (docs/decisions/0051) they start at once and the rest fill in around them, instead
    of one of them ending the run alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# scripts/test.sh collects only this directory for its `perf` run (a whole collection costs
# seconds): a `perf` test anywhere else would run in neither of its two runs.
PERF_DIRECTORY = Path(__file__).resolve().parent / "e2e"


def pytest_itemcollected(item: pytest.Item) -> None:
    """A `perf` test outside PERF_DIRECTORY is a collection error, not a test that never runs."""
    if item.get_closest_marker("perf") and PERF_DIRECTORY not in item.path.parents:
        # Not UsageError: an xdist worker would end with "no tests ran" and drop the message.
        raise RuntimeError(f"{item.nodeid}: a perf test must live under {PERF_DIRECTORY}")


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which would answer first
def pytest_xdist_make_scheduler(
    config: pytest.Config, log: Any
) -> ModuleOrDirectoryScheduling | None:
    """`--dist loadfile`, with tests/spark_jobs/ as one unit (tests/support/scheduling.py)."""
    return make_scheduler(config, log)


def _outlast_deadlocks(sender: Any, connection: Any, **kwargs: Any) -> None:
    """The test process's own sessions wait 10 s before they look for a deadlock; servers and
    workers keep Postgres' 1 s. The TRUNCATE that empties the test database between tests can
    meet a module's Celery scan or a server still answering in a lock cycle: the server's
    session is then the one Postgres cancels (it runs again at its next tick), not the flush,
    whose failure would leave the next tests a database that is not empty."""
    with connection.cursor() as cursor:
        cursor.execute("SET deadlock_timeout = '10s'")


connection_created.connect(_outlast_deadlocks)


@pytest.fixture
def event_loop_in_main_thread() -> Iterator[None]:
    """The official RocketMQ Python client asks asyncio.get_event_loop() in the main thread. A
    test run before in the same process (several run in each: decision 0051) that used
    asyncio.run() leaves none set there, and the client's stream then fails to start."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield
    asyncio.set_event_loop(None)
    loop.close()


@pytest.fixture(autouse=True)
def fresh_configuration_epoch() -> None:
    """Each test's database starts over (a rollback or a flush, which no service sees): a new
    configuration epoch, so no web process uses a token, group or topic it cached in an earlier
    test (apps/broker/config_cache.py)."""
    config_cache.forget()
    config_cache.changed()
    failed_auth.forget()


def client_for(*scopes: str, name: str = "test") -> APIClient:
    _, raw = registry.token_create(name=name, scopes=list(scopes))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.fixture
def api(db: None) -> APIClient:
    return client_for("admin", name="admin-test")


@pytest.fixture
def make_client(db: None) -> Callable[..., APIClient]:
    return client_for


@pytest.fixture
def setup_topic(api: APIClient) -> Callable[..., dict[str, Any]]:
    """Creates a topic, a producer group and a consumer group; returns their names."""

    def make(
        topic: str = "orders",
        queues: int = 4,
        producer: str = "order-service",
        consumer: str = "billing",
        **consumer_options: Any,
    ) -> dict[str, Any]:
        assert (
            api.post("/api/v1/topics", {"name": topic, "queues": queues}, format="json").status_code
            == 201
        )
        assert (
            api.post(
                "/api/v1/producer-groups",
                {"name": producer, "check_url": "http://127.0.0.1:9/check"},
                format="json",
            ).status_code
            == 201
        )
        assert (
            api.post(
                "/api/v1/consumer-groups", {"name": consumer, **consumer_options}, format="json"
            ).status_code
            == 201
        )
        return {"topic": topic, "producer": producer, "consumer": consumer}

    return make


def db_url_for_tests() -> str:
    db = settings.DATABASES["default"]
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


class Server:
    def __init__(self, base: str) -> None:
        self.base = base
        self.session = requests.Session()

    def url(self, path: str) -> str:
        return self.base + path

    def token(self, *scopes: str) -> dict[str, str]:
        _, raw = registry.token_create(name="http-test", scopes=list(scopes))
        return {"Authorization": f"Bearer {raw}"}


def start_gunicorn(
    port: int,
    *,
    workers: int = 2,
    threads: int = 8,
    log: Any = None,
    extra_env: dict[str, str] | None = None,
) -> Any:
    """A real gunicorn on the test database, started as scripts/run.sh starts it (ASGI: uvicorn
    workers, `threads` Django threads each), in its own process group; returns once it answers."""
    env = {
        **os.environ,
        "DATABASE_URL": db_url_for_tests(),
        "CELERY_BROKER_URL": redis_url("celery"),
        "TXHUB_WEB_THREADS": str(threads),
        **(extra_env or {}),
    }
    process = subprocess.Popen(
        web_command(port, workers=workers),
        cwd=ROOT,
        env=env,
        stdout=log or subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                return process
        except (requests.ConnectionError, requests.Timeout):  # still booting (a busy machine)
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("gunicorn did not start")


@pytest.fixture(scope="session")
def gunicorn(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    """A real gunicorn (2 workers x 8 threads) serving the test database."""
    port = free_port()
    with open(log_path("test-gunicorn.log"), "w") as log:
        process = start_gunicorn(port, log=log)
        yield f"http://127.0.0.1:{port}"
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


@pytest.fixture
def server(gunicorn: str, transactional_db: None) -> Server:
    return Server(gunicorn)


@pytest.fixture
def checker() -> Iterator[Any]:
    from tests.checker import Checker

    fake = Checker()
    yield fake
    fake.close()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None) -> Iterator[None]:  # noqa: F811 - pytest-django's, wrapped
    """pytest-django's test database, whose other sessions are ended before it is dropped: the
    threads of this process each kept a connection of Django's (a thread's own), idle since its
    test, and DROP DATABASE refuses a database anyone is connected to."""
    yield
    import psycopg

    db = settings.DATABASES["default"]
    # Never `make run`'s database: only one pytest-django made for this run.
    assert str(db["NAME"]).startswith("test_"), db["NAME"]
    with psycopg.connect(
        dbname="postgres", user=db["USER"], host=db["HOST"], port=db["PORT"], autocommit=True
    ) as other:
        other.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE datname = %s",
            [db["NAME"]],
        )
