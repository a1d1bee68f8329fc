"""Producers beside a junk-token flood: prepare + commit p50 / p99 and messages/s alone and
while another address sends ~1,000 requests/s with random bearer tokens (docs/decisions/0038),
and how the flood was answered. Runs against a running `make run`; `make bench` prints it.

    .venv/bin/python bench/junk_tokens.py [--url http://127.0.0.1:8000] [--rate 1000]
"""

import argparse
import os
import secrets
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from slow_clients import line, produce, web_rss_mib  # noqa: E402


class Flood:
    """Junk-token GETs at `rate` per second from 127.0.0.2 (another address than the producers'
    127.0.0.1), on a few kept-alive connections; counts the answers by status."""

    def __init__(self, host: str, port: int, rate: int) -> None:
        self.address, self.rate = (host, port), rate
        self.statuses: Counter[int] = Counter()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(16)]

    def connect(self) -> socket.socket:
        sock = socket.socket()
        sock.bind(("127.0.0.2", 0))
        sock.connect(self.address)
        return sock

    def run(self) -> None:
        interval = len(self.threads) / self.rate
        while not self.stop.is_set():
            started = time.monotonic()
            token = "txh_" + secrets.token_urlsafe(32)
            try:
                # A connection per request: txhub closes one after refusing its token.
                with self.connect() as sock:
                    sock.sendall(
                        f"GET /api/v1/topics HTTP/1.1\r\nHost: {self.address[0]}\r\n"
                        f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n".encode()
                    )
                    status = int(sock.makefile("rb").readline().split()[1])
            except (OSError, IndexError, ValueError):
                status = 0
            self.statuses[status] += 1
            time.sleep(max(0.0, interval - (time.monotonic() - started)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=f"http://127.0.0.1:{os.environ.get('TXHUB_PORT', '8000')}")
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")
    import django

    django.setup()
    from apps.broker.services import registry

    name = f"bench-junk-{int(time.time())}"
    registry.topic_create(name=name, queues=4)
    registry.producer_group_create(name=name, check_url="https://127.0.0.1:9/")
    token = registry.token_create(name=name, scopes=[f"produce:{name}"])[1]
    base = f"{args.url}/api/v1"
    host, port = args.url.split("//")[1].split(":")
    alone = produce(base, token, name, args.producers, args.seconds)
    print(line(f"{args.producers} producers alone", alone, args.seconds, web_rss_mib()))
    flood = Flood(host, int(port), args.rate)
    for thread in flood.threads:
        thread.start()
    beside = produce(base, token, name, args.producers, args.seconds)
    flood.stop.set()
    for thread in flood.threads:
        thread.join()
    sent = sum(flood.statuses.values())
    print(
        line(
            f"beside a junk-token flood ({sent / args.seconds:.0f}/s)",
            beside,
            args.seconds,
            web_rss_mib(),
        )
    )
    print(f"  the flood was answered: {dict(sorted(flood.statuses.items()))}")


if __name__ == "__main__":
    main()
