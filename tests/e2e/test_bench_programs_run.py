"""Every program under bench/ runs to its end at tiny sizes against real servers (issue 27): a
bench that no longer runs (a refused check URL, a renamed setting) is a red test here, not a
surprise months later. No figure is asserted: each must exit 0 and print its lines."""

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import BIN, ROOT, db_url_for_tests
from tests.e2e.conftest import Celery
from tests.grpc.conftest import GrpcServer, grpc_server  # noqa: F401 - the fixture
from tests.support.ports import free_ports

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.timeout(400),
]

# Programs, not libraries: bench/*.py with a main (cpu.py, http_client.py and seed.py are
# libraries their own tests cover), and the on_commit comparison.
SMOKED = {
    "auth_cost.py",
    "checkback_scan.py",
    "console_pages.py",
    "delay_lateness.py",
    "grpc_other_servers.py",
    "grpc_send.py",
    "hostile_body.py",
    "junk_tokens.py",
    "oncommit/run.py",
    "produce_consume.py",
    "reconcile.py",
    "slow_clients.py",
    "waiting.py",
}
# Programs another one starts (their smoke run is that one's).
STARTED_BY = {
    "oncommit/shop/producer.py": "oncommit/run.py",
    "fifo.py": "produce_consume.py",
    "grpc_floor.py": "grpc_send.py",  # its grpc.aio server, answering from bytes
}


def run_bench(program: str, *args: str, timeout: float = 240, **env: str) -> str:
    """As the README runs a bench: from a terminal of its own, which has none of the settings
    `make run` and `make test` export for their servers (http check URLs among them)."""
    terminal = {k: v for k, v in os.environ.items() if k != "TXHUB_ALLOW_HTTP_CALLBACKS"}
    result = subprocess.run(
        [str(BIN / "python"), str(ROOT / "bench" / program), *args],
        cwd=ROOT,
        env={**terminal, "DATABASE_URL": db_url_for_tests(), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, (
        f"bench/{program} exited {result.returncode}\n"
        f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    )
    assert result.stdout.strip(), f"bench/{program} printed nothing"
    return result.stdout


def test_every_bench_program_has_a_smoke_run() -> None:
    programs = {
        str(path.relative_to(ROOT / "bench"))
        for path in (ROOT / "bench").rglob("*.py")
        if '__name__ == "__main__"' in path.read_text()
    }
    assert programs == SMOKED | set(STARTED_BY)


def test_make_bench_runs_at_tiny_sizes(gunicorn: str, grpc_server: GrpcServer) -> None:  # noqa: F811
    out = run_bench(
        "produce_consume.py",
        *("--url", gunicorn, "--concurrency", "2", "--seconds", "1", "--pgbench-seconds", "1"),
        *("--rpc-calls", "5"),
        *("--skip", "waiting,oncommit"),  # each has its own smoke run below
        TXHUB_GRPC_PORT=str(grpc_server.port),
    )
    for line in (
        "txhub / ceiling:",
        "batched / ceiling:",
        "server CPU, single",
        "gRPC",
        # issue 28: the gRPC door's CPU beside REST's, and per hot RPC
        "gRPC door server CPU per message: gRPC processes",
        "gRPC door CPU per call",
        # what a message costs the whole machine through each door, and the ceiling it sets
        "gRPC door machine CPU per message: machine",
        "REST machine CPU per message: machine",
        "gRPC door round trips: send p50",
        # the same workload through REST with the official client's habit (an ack per message),
        # and each hot call through the lean door beside the gRPC door's
        "REST acking one message per request, as the official client:",
        "REST lean door CPU per call",
        "gRPC door / REST lean door per call",
        # the least a grpc.aio door could spend per message, beside the target (decision 0067)
        "gRPC door floor per message:",
        "beside a junk-token flood",
        # issue 29: bench/fifo.py, which make bench runs
        "FIFO consumer group",
        "1000 message groups",
        "one message group",
    ):
        assert line in out, out


def test_waiting_runs(gunicorn: str) -> None:
    out = run_bench(
        "waiting.py", "--url", gunicorn, "--consumers", "5", "--samples", "3", "--window", "1"
    )
    assert "commit -> waiting consumer" in out, out


def test_the_on_commit_comparison_runs() -> None:
    out = run_bench(
        "oncommit/run.py",
        *("--seconds", "1", "--producers", "2", "--settle", "2"),
        *("--producer-kills", "1", "--worker-kills", "1"),
    )
    assert "django on_commit + celery" in out, out


def test_auth_cost_runs() -> None:
    out = run_bench("auth_cost.py", "--calls", "5", TXHUB_THROTTLE_RATE="1000000/s")
    assert "gRPC door:" in out, out


def test_checkback_scan_runs() -> None:
    run_bench("checkback_scan.py", "--pending", "200", "--due", "20")


def test_console_pages_runs(gunicorn: str) -> None:
    run_bench("console_pages.py", "--transactions", "200", "--rounds", "2", "--url", gunicorn)


def test_delay_lateness_runs(
    gunicorn: str, start_celery: Callable[..., Celery], tmp_path: Path
) -> None:
    start_celery()  # beat and a worker deliver the delayed messages
    run_bench(
        "delay_lateness.py",
        *("--url", gunicorn, "--messages", "20", "--window", "2", "--senders", "2"),
        *("--lead", "2"),
    )


def test_slow_clients_runs(gunicorn: str) -> None:
    out = run_bench("slow_clients.py", "--url", gunicorn, "--lorises", "50", "--seconds", "1")
    assert "beside 50 slow lorises" in out, out


def test_grpc_other_servers_runs() -> None:
    # The Python servers only: the Node ones need bench/node's `npm ci`, which `make test` does
    # not run (docs/decisions/0105).
    port, endpoint_port = free_ports(2)
    out = run_bench(
        "grpc_other_servers.py",
        *("--only", "a,c", "--calls", "20", "--warm", "5", "--streams", "2", "--rounds", "1"),
        *("--port", str(port), "--endpoint-port", str(endpoint_port)),
    )
    assert "grpc sync server, thread pool" in out, out


def test_hostile_body_runs() -> None:
    run_bench("hostile_body.py", "--elements", "1000")


def test_reconcile_runs() -> None:
    out = run_bench("reconcile.py", "--sizes", "2000", timeout=300)
    assert "transactions/s" in out, out
