"""Producers beside slow-loris clients: prepare + commit p50 / p99 and messages/s with and without
N connections that trickle a request head and never finish it (re-opened as the server closes
them at TXHUB_WEB_REQUEST_READ_SECONDS), and the web processes' memory. Runs against a running
`make run` (docs/decisions/0033).

    .venv/bin/python bench/slow_clients.py [--url http://127.0.0.1:8000] [--lorises 1000]
"""

import argparse
import os
import selectors
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from http_client import Client  # noqa: E402


def web_rss_mib() -> float:
    """VmRSS of this checkout's web processes (gunicorn and its workers), MiB."""
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"gunicorn" not in (proc / "cmdline").read_bytes():
                continue
            if os.path.realpath(proc / "cwd") != str(ROOT):
                continue
            status = (proc / "status").read_text()
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS"):
                total += int(line.split()[1])
    return total / 1024


class Lorises:
    """`count` connections that always trickle an unfinished head; one the server closes is
    opened again, so there are `count` of them all along."""

    def __init__(self, address: tuple[str, int], count: int) -> None:
        self.address, self.count = address, count
        self.sockets: list[socket.socket] = []
        self.reopened = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def open_one(self) -> None:
        sock = socket.create_connection(self.address)
        sock.sendall(b"POST /api/v1/transactions HTTP/1.1\r\nHost: bench\r\nX-Slow: 1")
        self.sockets.append(sock)

    def run(self) -> None:
        # epoll, not select(): a thousand sockets go past file descriptor 1024.
        watcher = selectors.DefaultSelector()
        while len(self.sockets) < self.count:
            self.open_one()
            watcher.register(self.sockets[-1], selectors.EVENT_READ)
        while not self.stop.is_set():
            for key, _ in watcher.select(0.2):  # answered (408) or closed: open another
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                watcher.unregister(sock)
                sock.close()
                self.sockets.remove(sock)
                self.open_one()
                watcher.register(self.sockets[-1], selectors.EVENT_READ)
                self.reopened += 1
        watcher.close()
        for sock in self.sockets:
            sock.close()


def produce(base: str, token: str, name: str, producers: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    lock = threading.Lock()
    until = time.monotonic() + seconds

    def one_producer() -> None:
        client = Client(base, token)
        mine = []
        while time.monotonic() < until:
            started = time.monotonic()
            tx = client.post(
                "/transactions", {"producer_group": name, "topic": name, "body": "order"}
            )
            client.post(f"/transactions/{tx['transaction_id']}/commit")
            mine.append(time.monotonic() - started)
        client.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=one_producer) for _ in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies


def line(what: str, latencies: list[float], seconds: float, rss: float) -> str:
    ms = sorted(1000 * x for x in latencies)
    p99 = statistics.quantiles(ms, n=100)[98] if len(ms) > 1 else ms[0]
    return (
        f"{what}: {len(ms) / seconds:7.1f} messages/s, prepare+commit p50 "
        f"{statistics.median(ms):.1f} ms, p99 {p99:.1f} ms; web RSS {rss:.0f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=f"http://127.0.0.1:{os.environ.get('TXHUB_PORT', '8000')}")
    parser.add_argument("--lorises", type=int, default=1000)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")
    import django

    django.setup()
    from apps.broker.services import registry

    name = f"bench-slow-{int(time.time())}"
    registry.topic_create(name=name, queues=4)
    registry.producer_group_create(name=name, check_url="https://127.0.0.1:9/")
    token = registry.token_create(name=name, scopes=[f"produce:{name}"])[1]
    base = f"{args.url}/api/v1"
    host, port = args.url.split("//")[1].split(":")
    alone = produce(base, token, name, args.producers, args.seconds)
    print(line(f"{args.producers} producers alone", alone, args.seconds, web_rss_mib()))
    lorises = Lorises((host, int(port)), args.lorises)
    lorises.thread.start()
    while len(lorises.sockets) < args.lorises:
        time.sleep(0.05)
    beside = produce(base, token, name, args.producers, args.seconds)
    rss = web_rss_mib()
    lorises.stop.set()
    lorises.thread.join()
    print(line(f"beside {args.lorises} slow lorises", beside, args.seconds, rss))
    print(f"  slow connections closed by the server and opened again: {lorises.reopened}")


if __name__ == "__main__":
    main()
