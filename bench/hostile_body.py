"""What one hostile 4 MB request costs the server (issue 9, OWASP API4: resource consumption).

Starts a real gunicorn (one ASGI worker process, as `make run` does: its figures are the
request's) on the database of the current settings (`make run`'s or your TXHUB_PG_PORT's), once
per body, sends one hostile body and prints: the answer's status and size, the wall time, the
worker's CPU time and its peak RSS (VmHWM) against its RSS before the request.

    .venv/bin/python bench/hostile_body.py [--elements 1000000]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")

import django  # noqa: E402

django.setup()

from apps.broker.models import ApiToken  # noqa: E402
from apps.broker.services import registry  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bodies(n: int) -> list[tuple[str, str, bytes]]:
    """(what, path, body): each about 4 MB, under the 8 MiB the server reads at all."""
    keys = ",".join(['"a"'] * n)
    bad_keys = ",".join(["1"] * n)
    props = ",".join(f'"{i:x}":""' for i in range(n // 4))
    handles = ",".join(['"1.a"'] * (n * 4 // 6))
    unknown = ",".join(f'"u{i:x}":1' for i in range(n // 4))
    nested = "[" * n + "]" * n
    return [
        ("keys: 1M strings", "/api/v1/topics/t/messages",
         f'{{"producer_group":"g","body":"x","keys":[{keys}]}}'.encode()),
        ("keys: 1M non-strings", "/api/v1/topics/t/messages",
         f'{{"producer_group":"g","body":"x","keys":[{bad_keys}]}}'.encode()),
        ("properties: 250k entries", "/api/v1/topics/t/messages",
         f'{{"producer_group":"g","body":"x","properties":{{{props}}}}}'.encode()),
        ("receipt_handles: 670k", "/api/v1/consumer-groups/g/ack",
         f'{{"receipt_handles":[{handles}]}}'.encode()),
        ("250k unknown fields", "/api/v1/topics/t/messages",
         f'{{"producer_group":"g","body":"x",{unknown}}}'.encode()),
        ("nesting 1M deep", "/api/v1/topics/t/messages",
         f'{{"producer_group":"g","body":"x","properties":{nested}}}'.encode()),
    ]  # fmt: skip


def proc_figures(pid: int) -> tuple[float, int, int]:
    """The process's CPU seconds, RSS and peak RSS (KiB)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return cpu, int(status["VmRSS"].split()[0]), int(status["VmHWM"].split()[0])


def worker_pid(master: int) -> int:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return int(children[0])


def one(what: str, path: str, body: bytes, token: str) -> None:
    port = free_port()
    server = subprocess.Popen(
        # As scripts/run.sh starts the web tier (ASGI, uvicorn worker), with one worker process.
        [str(Path(sys.executable).parent / "gunicorn"), "txhub.asgi:application",
         "--worker-class", "txhub.worker.TxhubWorker",
         "--bind", f"127.0.0.1:{port}", "--workers", "1", "--timeout", "300", "--preload"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                requests.get(base + "/healthz", timeout=5)
                break
            except requests.RequestException:
                time.sleep(0.1)
        # Warm the worker (imports, DB connection) so the figures are the request's own.
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        requests.post(base + path, data=b"{}", headers=headers, timeout=60)
        pid = worker_pid(server.pid)
        cpu0, rss0, _ = proc_figures(pid)
        start = time.monotonic()
        answer = requests.post(base + path, data=body, headers=headers, timeout=600)
        wall = time.monotonic() - start
        cpu1, _, peak = proc_figures(pid)
        print(
            f"{what:28} {len(body) / 1e6:4.1f} MB -> {answer.status_code} "
            f"{len(answer.content):>10,} B answer  wall {wall:6.2f} s  cpu {cpu1 - cpu0:6.2f} s  "
            f"rss {rss0 / 1024:5.0f} MiB -> peak {peak / 1024:6.0f} MiB"
        )
    finally:
        server.terminate()
        server.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--elements", type=int, default=1_000_000)
    args = parser.parse_args()
    token, raw = registry.token_create(name="bench-hostile", scopes=["admin"])
    try:
        for what, path, body in bodies(args.elements):
            one(what, path, body, raw)
    finally:
        ApiToken.objects.filter(pk=token.pk).delete()
    print(json.dumps({"elements": args.elements}))


if __name__ == "__main__":
    main()
