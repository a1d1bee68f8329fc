import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery as CeleryApp
from kombu.connection import Connection
from kombu.exceptions import OperationalError
from playwright.sync_api import Browser, Page, sync_playwright
from redis.exceptions import RedisError

from tests.conftest import BIN, ROOT, Server, db_url_for_tests
from tests.support import workers
from tests.support.ports import free_port

# The Redis of this checkout's services.sh (also `make run`'s): tests never stop it; a test that
# stops Redis or Postgres uses a server of its own (PrivateRedis, the `private_cluster` fixture).
REDIS_PORT = workers.REDIS_PORT
TEST_BROKER_URL = workers.redis_url("celery")

# Fast timings for tests; each is the production setting of the same name.
FAST = {
    "TXHUB_TRANSACTION_TIMEOUT": "1",
    "TXHUB_CHECK_INTERVAL": "1",
    "TXHUB_CHECK_MAX": "3",
    "TXHUB_CHECK_HTTP_TIMEOUT": "2",
    "TXHUB_SCAN_SECONDS": "0.5",
    "TXHUB_EXPIRE_SCAN_SECONDS": "1",
    # Fewer callback processes than run.sh's 8 on a small test machine; still above the per-group
    # cap (2), as the production arithmetic requires.
    "TXHUB_CALLBACK_CONCURRENCY": "4",
}


class Celery:
    """Real Celery processes (workers + one beat) on the test database and Redis database 1."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp = tmp
        self.env = {
            **os.environ,
            "DATABASE_URL": db_url_for_tests(),
            "CELERY_BROKER_URL": TEST_BROKER_URL,
            # wait_ready() reads beat's "Sending due task" and the workers' "succeeded" lines,
            # which are quiet by default (txhub/celery.py, scripts/run.sh).
            "TXHUB_TASK_LOG_LEVEL": "INFO",
            **FAST,
            **env,
        }
        self.log = (tmp / "celery.log").open("a")
        self.workers: list[subprocess.Popen[bytes]] = []
        self.beat: subprocess.Popen[bytes] | None = None
        # Both queues: a check-back task another test left behind must not run here.
        self.purge()

    def _spawn(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [str(BIN / "celery"), "-A", "txhub", *args, "--loglevel", "INFO"],
            cwd=ROOT,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start_worker(self, concurrency: int = 4, queue: str = "celery") -> subprocess.Popen[bytes]:
        """A worker of one queue, as scripts/run.sh starts them: "celery" (the default queue:
        scans) or "callbacks" (producers' check calls)."""
        name = f"w{len(self.workers)}-{queue}@%h"
        worker = self._spawn(
            "worker", "--concurrency", str(concurrency), "-Q", queue, "-n", name, "--without-mingle"
        )
        self.workers.append(worker)
        return worker

    def start_beat(self) -> None:
        self.beat = self._spawn("beat", "--schedule", str(self.tmp / "beat-schedule"))

    def wait_ready(self, timeout: float = 60) -> None:
        """Returns once every worker answers a ping and, with a beat, once beat has sent a task
        that a worker then ran: tests time things from here, not from a process still booting
        (a cold start takes seconds on a busy machine)."""
        deadline = time.monotonic() + timeout
        names = {self._name_of(worker) for worker in self.workers}
        answered: set[str] = set()
        failure: Exception | None = None
        while names - answered and time.monotonic() < deadline:
            for died in [w for w in self.workers if w.poll() is not None]:
                raise AssertionError(f"celery worker exited with {died.returncode}")
            control = CeleryApp(broker=self.env["CELERY_BROKER_URL"])
            try:
                replies = control.control.ping(destination=sorted(names - answered), timeout=1)
                answered |= {name for reply in replies for name in reply}
            except (OSError, OperationalError, RedisError) as error:
                failure = error  # Redis itself still coming up (e.g. just restarted): ask again
                time.sleep(0.2)
            finally:
                control.close()
        missing = sorted(names - answered)
        assert not missing, f"celery workers not ready: {missing} (last error: {failure!r})"
        if self.beat is None or not self.workers:
            return
        # Beat's first ticks: a task it sent after this point, and a worker that ran one.
        log_path = Path(self.log.name)
        start = log_path.stat().st_size
        ticked = re.compile(r"Scheduler: Sending due task")
        ran = re.compile(r"Task apps\.broker\.tasks\.\w+\[[^\]]+\] succeeded")
        while time.monotonic() < deadline:
            assert self.beat.poll() is None, f"celery beat exited with {self.beat.returncode}"
            with log_path.open("rb") as log:
                log.seek(start)
                text = log.read().decode(errors="replace")
            sent_at = ticked.search(text)
            if sent_at and ran.search(text, sent_at.end()):
                return
            time.sleep(0.1)
        raise AssertionError("celery beat did not tick, or no worker ran its task, in time")

    @staticmethod
    def _name_of(worker: subprocess.Popen[bytes]) -> str:
        args = [str(arg) for arg in worker.args]  # type: ignore[union-attr]
        return args[args.index("-n") + 1].replace("%h", socket.gethostname())

    def tasks_run_by(self, worker: subprocess.Popen[bytes]) -> dict[str, int]:
        """How many of each task this worker has run (its `celery inspect stats`)."""
        name = self._name_of(worker)
        control = CeleryApp(broker=self.env["CELERY_BROKER_URL"])
        try:
            stats = control.control.inspect(destination=[name], timeout=5).stats() or {}
        finally:
            control.close()
        assert name in stats, f"celery worker {name} did not answer `inspect stats`"
        return {task: int(count) for task, count in stats[name].get("total", {}).items()}

    def kill_worker(self, worker: subprocess.Popen[bytes]) -> None:
        """SIGKILL the worker and its pool processes: a crash, not a shutdown."""
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        self.workers.remove(worker)

    def purge(self) -> None:
        """Drops what is queued and not yet taken, on both queues (a stack shared by a module's
        tests: an earlier test's tasks never run in a later one's)."""
        with Connection(self.env["CELERY_BROKER_URL"]) as connection:  # type: ignore[no-untyped-call]
            for queue in ("celery", "callbacks"):
                connection.default_channel.queue_purge(queue)

    def assert_running(self) -> None:
        for process in [*self.workers, *([self.beat] if self.beat else [])]:
            assert process.poll() is None, f"a shared celery process exited: {process.args!r}"

    def stop(self) -> None:
        for process in [*self.workers, *([self.beat] if self.beat else [])]:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for process in [*self.workers, *([self.beat] if self.beat else [])]:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        self.log.close()


def launch(tmp: Path, workers: int = 1, beat: bool = True, **env: Any) -> Celery:
    """Celery as scripts/run.sh starts it, once it is ready."""
    celery = Celery(tmp, {k: str(v) for k, v in env.items()})
    try:
        for _ in range(workers):
            celery.start_worker()
        # The callbacks worker of scripts/run.sh: check calls never wait behind scans.
        callbacks = int(celery.env.get("TXHUB_CALLBACK_CONCURRENCY", "8"))
        celery.start_worker(concurrency=callbacks, queue="callbacks")
        if beat:
            celery.start_beat()
        celery.wait_ready()
    except BaseException:
        celery.stop()
        raise
    return celery


@pytest.fixture
def start_celery(transactional_db: None, tmp_path: Path) -> Iterator[Callable[..., Celery]]:
    """A stack of the test's own, with the settings it asks for."""
    started: list[Celery] = []

    def start(workers: int = 1, beat: bool = True, **env: Any) -> Celery:
        started.append(celery := launch(tmp_path, workers, beat, **env))
        return celery

    yield start
    for celery in started:
        celery.stop()


@pytest.fixture(scope="module")
def module_celery(django_db_setup: None, tmp_path_factory: Any) -> Iterator[Celery]:
    """The default stack (one scans worker, the callbacks worker, beat), started once for all
    of a module's tests that ask for `celery_processes` (docs/decisions/0058)."""
    celery = launch(Path(tmp_path_factory.mktemp("celery")))
    yield celery
    celery.stop()


@pytest.fixture
def celery_processes(transactional_db: None, module_celery: Celery) -> Celery:
    """The module's shared stack, still running, with nothing left queued by an earlier test:
    each test's rows are its own (a transactional test's flush) and its checker is new."""
    module_celery.assert_running()
    module_celery.purge()
    return module_celery


class PrivateRedis:
    """A Redis server of one test's own, on a free port: stopping it harms no other test and
    not the `make run` on this machine."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.dir = directory
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return done.stdout.strip()

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port)]
            + ["--dir", str(self.dir), "--appendonly", "yes", "--save", ""],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while self.cli("ping") != "PONG":
            assert self.process.poll() is None, "redis-server exited"
            assert time.monotonic() < deadline, "redis-server did not answer in 20 s"
            time.sleep(0.05)

    def shutdown(self) -> None:
        """SHUTDOWN NOSAVE, as an operator's or a crash's loss of the broker."""
        self.cli("shutdown", "nosave")
        if self.process is not None:
            self.process.wait(timeout=20)
            self.process = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    (tmp_path / "redis").mkdir()
    redis = PrivateRedis(tmp_path / "redis")
    redis.start()
    yield redis
    if redis.process is not None:
        redis.shutdown()


@pytest.fixture(scope="session")
def private_cluster() -> Iterator[Any]:
    """Postgres, Redis and (when a test starts it) gunicorn of their own, on free ports, for the
    tests that crash Postgres: they must never stop the servers other tests or `make run` use
    (issue 27). Shared by those tests, one at a time; each uses names of its own."""
    from tests.chaos.cluster import Cluster

    cluster = Cluster(settings={}, web_workers=1)
    try:
        cluster.pg_init()
        cluster.redis_start()
        yield cluster
    finally:
        cluster.stop()
        cluster.cleanup()


CHROMIUM = os.environ.get("TXHUB_CHROMIUM", "/usr/bin/chromium")
# Needed as root in a container; background networking would try to reach Google's hosts.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's headless Chromium, driven by Playwright, for the console's browser tests."""
    # Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
    # between browser steps are still synchronous, which Django must be told is fine here.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        yield chromium
        chromium.close()
    del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


@pytest.fixture
def page(browser: Browser, server: Server) -> Iterator[Page]:
    context = browser.new_context(base_url=server.base, viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    yield opened
    context.close()
