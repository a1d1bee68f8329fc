"""FIFO consumer groups (issue 29): messages/s end to end through a FIFO consumer group with 1,000
message groups, next to the same run without groups (the target: at least 80 % of it), and with a
single message group (serial by nature: one message in flight at a time).

Each run: a topic of 4 queues and a FIFO consumer group of its own; N producers send single
messages (`POST /topics/{t}/messages`, each naming a message group at random) for `--seconds`;
4 consumers receive (32 at a time, waiting up to 1 s) and ack until every message sent is acked.
messages/s = messages / time to the last ack (bench/produce_consume.py's run_load). Runs against
a running `make run`; `make bench` calls it and prints its lines.

    .venv/bin/python bench/fifo.py --url http://127.0.0.1:8000 --seconds 6
"""

import argparse
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from http_client import Client  # noqa: E402
from produce_consume import pg_data_dir, run_load, setup_django  # noqa: E402

CONSUMERS = 4


def setup(name: str) -> str:
    """Topic, producer group, FIFO consumer group, all named `name`; an admin token."""
    from apps.broker.services import registry

    registry.topic_create(name=name, queues=4)
    registry.producer_group_create(name=name, check_url="https://127.0.0.1:9/")
    registry.consumer_group_create(
        name=name, max_delivery_attempts=16, consume_from="first", fifo=True
    )
    _, token = registry.token_create(name="bench-fifo", scopes=["admin"])
    return token


def sender(groups: int) -> Callable[[Client, str], int]:
    """One send per call, to one of `groups` message groups (none when 0)."""
    rng = random.Random(groups)  # noqa: S311 - a spread, not a secret

    def send(client: Client, name: str) -> int:
        message = {"producer_group": name, "body": "bench message body"}
        if groups:
            message["message_group"] = f"group-{rng.randrange(groups)}"
        client.post(f"/topics/{name}/messages", message)
        return 1

    return send


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=f"http://127.0.0.1:{os.environ.get('TXHUB_PORT', '8000')}")
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--groups", type=int, default=1000)
    args = parser.parse_args()
    setup_django()
    data_dir = pg_data_dir()
    base = f"{args.url}/api/v1"
    stamp = os.getpid()
    rates: dict[int, dict[str, float]] = {}
    # One group is serial: a third of the time still leaves it far more than it drains.
    for groups, seconds in [(0, args.seconds), (args.groups, args.seconds), (1, args.seconds / 3)]:
        name = f"bench-fifo-{stamp}-{groups}"
        token = setup(name)
        rates[groups] = run_load(
            base, token, name, args.producers, seconds, sender(groups), data_dir, CONSUMERS
        )
    plain, many, one = rates[0], rates[args.groups], rates[1]
    print(
        f"FIFO consumer group ({args.producers} producers sending, {CONSUMERS} consumers; "
        "messages/s to the last ack):"
    )
    print(
        f"  without message groups   {plain['rate']:8.1f} messages/s   "
        f"server CPU {plain['cpu_server']:6.2f} ms/message"
    )
    print(
        f"  {args.groups} message groups{'':<{9 - len(str(args.groups))}}{many['rate']:8.1f} "
        f"messages/s   server CPU {many['cpu_server']:6.2f} ms/message   "
        f"= {100 * many['rate'] / plain['rate']:.1f} % of the run without groups (target >= 80 %)"
    )
    print(
        f"  one message group        {one['rate']:8.1f} messages/s   "
        f"(serial by nature: one message in flight; {one['messages']:.0f} messages)"
    )


if __name__ == "__main__":
    main()
