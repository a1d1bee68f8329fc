"""A txhub of its own for fault injection: a Postgres cluster and a Redis server in a temporary
directory on free ports (never the ones `make run` uses), gunicorn, Celery workers and beat started
the way scripts/run.sh starts them, and handles to crash, pause and restart each part."""

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import requests
from celery import Celery as CeleryApp

from tests.support.ports import free_port
from tests.support.web import web_command

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PG_OS_USER = os.environ.get("TXHUB_PG_OS_USER", "txhub-pg")  # Postgres refuses to run as root


def pg_bin() -> Path:
    return sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))[-1]


def _as_pg_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", PG_OS_USER, "--", *command] if os.geteuid() == 0 else command


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:  # noqa: BLE001, S110 - "not up yet" looks like any error
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up within {timeout:.0f} s")


class Cluster:
    """Everything txhub needs, private to one chaos run. `env` is what every txhub process gets."""

    def __init__(self, *, settings: dict[str, str], web_workers: int = 2, beats: int = 1) -> None:
        # /var/tmp, not /tmp under a private root: the unprivileged Postgres user must reach it.
        self.dir = Path(tempfile.mkdtemp(prefix="txhub-chaos-", dir="/var/tmp"))
        os.chmod(self.dir, 0o755)  # noqa: S103 - readable by the Postgres user; no secrets
        self.pg_port, self.redis_port, self.web_port = free_port(), free_port(), free_port()
        self.web_workers = web_workers
        self.database_url = f"postgres://txhub@127.0.0.1:{self.pg_port}/txhub"
        self.env = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "CELERY_BROKER_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "TXHUB_PG_PORT": str(self.pg_port),
            "TXHUB_REDIS_PORT": str(self.redis_port),
            # Its own Redis for the cache too, not the one the test run's environment names.
            "TXHUB_CACHE_URL": f"redis://127.0.0.1:{self.redis_port}/3",
            "PROMETHEUS_MULTIPROC_DIR": str(self.dir / "metrics"),
            "TXHUB_RECONCILE_OUTPUT": str(self.dir / "reconciliation"),
            **settings,
        }
        (self.dir / "metrics").mkdir()
        self.logs = (self.dir / "logs").open("ab")
        self.web: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.beat: subprocess.Popen[bytes] | None = None
        self.beats = beats  # more than one: as on every machine of a cluster (decision 0044)
        self.more_beats: list[subprocess.Popen[bytes]] = []
        self.grpc: subprocess.Popen[bytes] | None = None
        self.token = ""  # an admin token, once the database exists

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    # Postgres -------------------------------------------------------------------------------

    @property
    def pg_data(self) -> Path:
        return self.dir / "pg"

    def pg_init(self) -> None:
        self.pg_data.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.pg_data, PG_OS_USER)
        os.chmod(self.pg_data, 0o700)
        subprocess.run(
            _as_pg_user(
                [str(pg_bin() / "initdb"), "-D", str(self.pg_data), "-U", "txhub"]
                + ["--auth=trust", "-E", "UTF8", "--locale=C.UTF-8"]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        with (self.pg_data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {self.pg_port}\n"
                "unix_socket_directories = ''\nmax_connections = 200\n"
            )
        self.pg_start()
        subprocess.run(
            [str(pg_bin() / "createdb"), "-h", "127.0.0.1", "-p", str(self.pg_port)]
            + ["-U", "txhub", "txhub"],
            check=True,
        )
        self.manage("migrate", "--noinput", "-v", "0")

    def pg_start(self) -> None:
        subprocess.run(
            _as_pg_user(
                [str(pg_bin() / "pg_ctl"), "-D", str(self.pg_data), "-l"]
                + [str(self.pg_data / "server.log"), "-w", "-t", "60", "start"]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def pg_stop(self, mode: str = "fast") -> None:
        """mode="immediate" is a crash: no shutdown checkpoint, WAL replay on the next start."""
        subprocess.run(
            _as_pg_user([str(pg_bin() / "pg_ctl"), "-D", str(self.pg_data), "-m", mode, "-w"])
            + ["stop"],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            cursor = conn.execute(query, params)
            return list(cursor.fetchall()) if cursor.description else []

    # Redis ----------------------------------------------------------------------------------

    def redis_start(self) -> None:
        (self.dir / "redis").mkdir(exist_ok=True)
        self.redis = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.redis_port)]
            + ["--dir", str(self.dir / "redis"), "--appendonly", "yes", "--save", ""],
            stdout=self.logs,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_for(lambda: self.redis_cli("ping") == "PONG", 20, "Redis")
        except RuntimeError as error:
            # What Redis said, kept in the error: the cluster's directory goes with its stop.
            self.logs.flush()
            said = (self.dir / "logs").read_bytes()[-2000:].decode(errors="replace")
            ended = self.redis.poll()
            raise RuntimeError(
                f"{error} (port {self.redis_port}; redis-server exit code {ended}); "
                f"the cluster's log ends:\n{said}"
            ) from None

    def redis_cli(self, *args: str) -> str:
        done = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(self.redis_port), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return done.stdout.strip()

    def redis_kill_and_wipe(self) -> None:
        """Redis dies without saving and comes back empty: every queued task is gone."""
        self.redis.kill()
        self.redis.wait()
        shutil.rmtree(self.dir / "redis")

    # txhub processes ------------------------------------------------------------------------

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [str(BIN / "python"), "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout

    def _spawn(self, *command: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(command),
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=self.logs,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def web_start(self, **env: str) -> None:
        """As scripts/run.sh starts it: ASGI, uvicorn workers (docs/decisions/0024); `env` adds
        variables for this start only."""
        self.web = self._spawn(
            *web_command(self.web_port, workers=self.web_workers, graceful_timeout=5), env=env
        )
        wait_for(lambda: requests.get(self.base + "/healthz", timeout=1).ok, 30, "gunicorn")

    def web_restart(self, **env: str) -> None:
        """A new gunicorn with these variables added (a failpoint armed, say) or, with none, the
        cluster's own environment again."""
        assert self.web is not None
        _killpg(self.web, signal.SIGTERM, wait=10)
        saved = dict(self.env)
        self.env.update(env)
        try:
            self.web_start()
        finally:
            self.env = saved

    def web_worker_pids(self) -> list[int]:
        assert self.web is not None
        children = Path(f"/proc/{self.web.pid}/task/{self.web.pid}/children").read_text()
        return [int(pid) for pid in children.split()]

    def celery_start(self) -> None:
        """The worker(s) and beat of scripts/run.sh, with this cluster's environment."""
        self._celery_spawn(celery_commands(self.dir, beats=self.beats))

    def _celery_spawn(self, commands: list[list[str]]) -> None:
        for command in commands:
            process = self._spawn(*command)
            if "beat" not in command:
                self.workers.append(process)
            elif self.beat is None:
                self.beat = process
            else:
                self.more_beats.append(process)
        wait_for(self._workers_answer, 60, "Celery workers")

    def _workers_answer(self) -> bool:
        """Every worker answers a ping, asked from this process: a `celery inspect ping` child
        imports Django and Celery again for each try. Over Sentinels (no broker URL: the
        settings find the master) the child asks."""
        if "CELERY_BROKER_URL" not in self.env:
            done = subprocess.run(
                [str(BIN / "celery"), "-A", "txhub", "inspect", "ping", "--timeout", "2"],
                cwd=ROOT,
                env=self.env,
                capture_output=True,
                text=True,
                check=False,
            )
            return done.stdout.count("pong") >= len(self.workers)
        control = CeleryApp(broker=self.env["CELERY_BROKER_URL"])
        try:
            replies = control.control.ping(timeout=1)
        finally:
            control.close()
        return len({name for reply in replies for name in reply}) >= len(self.workers)

    def celery_restart(self, queue: str | None = None, **env: str) -> None:
        """Workers and beat stopped and started again with these variables added (a failpoint
        armed, say) or, with none, the cluster's own environment again. With `queue`, only the
        worker that consumes it: the others and beat keep running."""
        commands = celery_commands(self.dir, beats=self.beats)
        if queue is None:
            stopping = self._celery_processes()
            self.workers, self.beat, self.more_beats = [], None, []
        else:
            commands = [command for command in commands if _consumes(command, queue)]
            stopping = [worker for worker in self.workers if _consumes(worker.args, queue)]
            if not (commands and stopping):
                raise ValueError(f"no Celery worker consumes {queue!r}")
            self.workers = [worker for worker in self.workers if worker not in stopping]
        _killpg_all(stopping, signal.SIGTERM, wait=20)
        saved = dict(self.env)
        self.env.update(env)
        try:
            self._celery_spawn(commands)
        finally:
            self.env = saved

    def celery_kill(self) -> None:
        """kill -9 of every worker (with its pool children) and of beat: a crash."""
        for process in self._celery_processes():
            _killpg(process, signal.SIGKILL)
        self.workers, self.beat, self.more_beats = [], None, []

    def _celery_processes(self) -> list[subprocess.Popen[bytes]]:
        return [*self.workers, *([self.beat] if self.beat else []), *self.more_beats]

    def start(self) -> None:
        self.pg_init()
        self.redis_start()
        self.web_start()
        self.celery_start()

    def grpc_start(self) -> int:
        """`manage.py grpcserver` on a free port (not started by start()); returns the port."""
        port = free_port()
        self.grpc = self._spawn(
            str(BIN / "python"), "manage.py", "grpcserver", env={"TXHUB_GRPC_PORT": str(port)}
        )

        def listening() -> bool:
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        wait_for(listening, 60, "the gRPC server")
        return port

    def stop(self) -> None:
        running = [*self._celery_processes(), self.web, self.grpc]
        _killpg_all([process for process in running if process is not None], signal.SIGTERM, 10)
        if getattr(self, "redis", None) is not None:
            _killpg(self.redis, signal.SIGTERM, wait=10)
        self.pg_stop()
        self.logs.close()

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def celery_commands(tmp: Path, beats: int = 1) -> list[list[str]]:
    """As scripts/run.sh starts them (kept in step with it; `beats` as its TXHUB_BEATS)."""
    celery = str(BIN / "celery")
    name = secrets.token_hex(3)
    return [
        [celery, "-A", "txhub", "worker", "--loglevel", "INFO", "--concurrency", "4"]
        + ["-Q", "celery", "-n", f"chaos-{name}@%h", "--without-mingle", "--without-gossip"],
        [celery, "-A", "txhub", "worker", "--loglevel", "INFO", "--concurrency", "8"]
        + ["-Q", "callbacks", "-n", f"chaos-cb-{name}@%h", "--without-mingle", "--without-gossip"],
    ] + [
        [celery, "-A", "txhub", "beat", "--loglevel", "INFO"]
        + ["--schedule", str(tmp / f"beat-{name}-{n}")]
        for n in range(beats)
    ]


def _consumes(command: Any, queue: str) -> bool:
    """A Celery worker's command line names `queue` among those after -Q."""
    words = list(command)
    return any(
        word == "-Q" and queue in following.split(",")
        for word, following in zip(words, words[1:], strict=False)
    )


def _killpg_all(processes: list[subprocess.Popen[bytes]], sig: int, wait: float) -> None:
    """`sig` to every process group at once (they stop side by side), then each waited for
    until `wait` s from now; one still running then is killed."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
    deadline = time.monotonic() + wait
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _killpg(process: subprocess.Popen[bytes], sig: int, wait: float = 10) -> None:
    _killpg_all([process], sig, wait)
