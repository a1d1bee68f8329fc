"""Delayed-delivery lateness: N delayed messages due spread over a window; a consumer receives
continuously; prints p50 / p99 / max of (received - due). Needs a running `make run`.

    .venv/bin/python bench/delay_lateness.py [--messages 10000] [--window 60]
"""

import argparse
import os
import statistics
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from http_client import Client  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=f"http://127.0.0.1:{os.environ.get('TXHUB_PORT', '8000')}")
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument(
        "--lead",
        type=float,
        default=None,
        help="seconds before the first is due (default: enough to send all)",
    )
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")
    import django

    django.setup()
    from apps.broker.services import registry

    _, token = registry.token_create(name="bench-delay", scopes=["admin"])
    name = f"bench-delay-{int(time.time())}"
    admin = Client(args.url + "/api/v1", token)
    admin.post("/topics", {"name": name, "queues": 4})
    admin.post("/producer-groups", {"name": name, "check_url": "https://127.0.0.1:9/"})
    admin.post("/consumer-groups", {"name": name})
    # Due times start once every message can have been sent (sending takes a while here).
    lead = args.lead if args.lead is not None else max(20.0, args.messages / 250)
    start = datetime.now(UTC) + timedelta(seconds=lead)
    due: dict[str, datetime] = {}
    lock = threading.Lock()

    def send(worker: int) -> None:
        client = Client(args.url + "/api/v1", token)
        for i in range(worker, args.messages, args.senders):
            at = start + timedelta(seconds=args.window * i / args.messages)
            sent = client.post(
                f"/topics/{name}/messages",
                {"producer_group": name, "body": str(i), "deliver_at": at.isoformat()},
            )
            with lock:
                due[sent["msg_id"]] = at

    lateness: list[float] = []
    early = 0

    def consume() -> None:
        nonlocal early
        client = Client(args.url + "/api/v1", token)
        while len(lateness) + early < args.messages:
            batch = client.post(
                f"/consumer-groups/{name}/receive",
                {"topic": name, "max_messages": 32, "wait_seconds": 1},
            )["messages"]
            now = datetime.now(UTC)
            for message in batch:
                late = (now - due[message["msg_id"]]).total_seconds()
                if datetime.fromisoformat(message["stored_at"]) < due[message["msg_id"]]:
                    early += 1
                lateness.append(late)
            if batch:
                client.post(
                    f"/consumer-groups/{name}/ack",
                    {"receipt_handles": [m["receipt_handle"] for m in batch]},
                )

    senders = [threading.Thread(target=send, args=(w,)) for w in range(args.senders)]
    for thread in senders:
        thread.start()
    for thread in senders:
        thread.join()
    sent_by = datetime.now(UTC)
    print(
        f"sent {args.messages:,} delayed messages; first due {start:%H:%M:%S}, "
        f"all sent {(sent_by - start).total_seconds():+.1f} s from the first due time"
    )
    consumer = threading.Thread(target=consume)
    consumer.start()
    consumer.join()
    q = statistics.quantiles(lateness, n=100)
    print(
        f"lateness (received - due) over {len(lateness):,} messages, due over {args.window:.0f} s:"
    )
    print(f"  p50 {q[49]:.3f} s   p99 {q[98]:.3f} s   max {max(lateness):.3f} s")
    print(f"  stored before their due time: {early}")


if __name__ == "__main__":
    main()
