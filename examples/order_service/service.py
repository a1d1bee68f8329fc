"""Order 9527: save an order in the service's own database and publish "order created", both or
neither, with txhub's transactional messages, the SDK and the barrier.

    python -m examples.order_service.service setup            # topic, groups, token (admin)
    python -m examples.order_service.service serve            # the check-back receiver
    python -m examples.order_service.service place 9527 [--crash-after-local-commit]
    python -m examples.order_service.service place-on-commit 9527 [--crash-after-local-commit]

`place-on-commit` is the usual alternative (Django's transaction.on_commit + Celery) for
comparison: with the crash flag, the order is saved and the message is lost for ever.
"""

import argparse
import json
import os
import sqlite3
from pathlib import Path
from typing import Any
from wsgiref.simple_server import make_server

from txhub_client import (
    Barrier,
    CheckbackApp,
    LocalTransactionState,
    Message,
    TransactionProducer,
)

HERE = Path(__file__).resolve().parent
STATE = Path(os.environ.get("ORDER_SERVICE_STATE", HERE / "var"))
TXHUB = os.environ.get("TXHUB_URL", "http://127.0.0.1:8000")
barrier = Barrier()


def config() -> dict[str, str]:
    return dict(json.loads((STATE / "config.json").read_text()))


def database() -> sqlite3.Connection:
    connection = sqlite3.connect(STATE / "orders.db", timeout=30)
    connection.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, item TEXT)")
    connection.commit()
    barrier.create_table(connection)
    return connection


class OrderListener:
    """RocketMQ's TransactionListener, with the barrier: the local transaction records the
    transaction id; check-back answers from that record."""

    def __init__(self, crash_after_local_commit: bool = False) -> None:
        self.crash = crash_after_local_commit

    def execute_local_transaction(self, message: Message, order_id: Any) -> LocalTransactionState:
        db = database()
        db.execute("INSERT INTO orders (id, item) VALUES (?, ?)", (order_id, "book"))
        barrier.record_commit(db, str(message.transaction_id))
        db.commit()
        print(f"order {order_id} saved locally (transaction {message.transaction_id})", flush=True)
        if self.crash:
            print("crashing after the local commit, before the commit call", flush=True)
            os._exit(1)
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        outcome = barrier.check(database(), str(message.transaction_id))
        print(f"check-back for {message.transaction_id}: {outcome}", flush=True)
        return LocalTransactionState[f"{outcome}_MESSAGE"]


def place(order_id: str, crash: bool) -> None:
    cfg = config()
    producer = TransactionProducer(TXHUB, cfg["token"], "order-service", OrderListener(crash))
    result = producer.send_message_in_transaction(
        Message("orders", f"order {order_id} created", keys=[order_id]), order_id
    )
    print(f"order {order_id}: message {result.msg_id} {result.state}", flush=True)


def place_on_commit(order_id: str, crash: bool) -> None:
    """The usual way: save, and publish in transaction.on_commit through Celery."""
    import django
    from django.conf import settings

    settings.configure(
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": STATE / "orders.db"}}
    )
    django.setup()
    from celery import Celery
    from django.db import connection, transaction

    cfg = config()
    celery = Celery(broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:63799/2"))
    publish = celery.signature("order_service.publish", args=(order_id, cfg["token"]))
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO orders (id, item) VALUES (%s, %s)", [order_id, "book"])
        if crash:
            # Dies after the local commit, before the task reaches the broker.
            transaction.on_commit(
                lambda: (print("crashing after the local commit", flush=True), os._exit(1))
            )
        transaction.on_commit(publish.delay)
    print(f"order {order_id} saved and published", flush=True)


def serve(port: int) -> None:
    app = CheckbackApp(OrderListener(), config()["signing_secret"])
    print(f"check-back receiver on http://127.0.0.1:{port}/check", flush=True)
    make_server("127.0.0.1", port, app).serve_forever()


def setup(admin_token: str, port: int) -> None:
    import requests

    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {admin_token}"
    url = f"{TXHUB}/api/v1"

    def created(response: requests.Response) -> requests.Response:
        # 409: it exists already (setup run again); anything else is an error worth stopping at.
        if response.status_code not in (200, 201, 409):
            raise SystemExit(f"setup failed: {response.status_code} {response.text}")
        return response

    created(api.post(f"{url}/topics", json={"name": "orders", "queues": 4}))
    group = created(
        api.post(
            f"{url}/producer-groups",
            json={"name": "order-service", "check_url": f"http://127.0.0.1:{port}/check"},
        )
    )
    if group.status_code == 409:
        group = created(api.post(f"{url}/producer-groups/order-service/rotate-secret"))
    created(api.post(f"{url}/consumer-groups", json={"name": "shipping"}))
    token = created(
        api.post(
            f"{url}/tokens",
            json={"name": "order-service", "scopes": ["produce:order-service", "consume:shipping"]},
        )
    ).json()
    STATE.mkdir(parents=True, exist_ok=True)
    (STATE / "config.json").write_text(
        json.dumps({"token": token["token"], "signing_secret": group.json()["signing_secret"]})
    )
    print("set up: topic orders, producer group order-service, consumer group shipping")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("setup")
    s.add_argument("--admin-token", default=os.environ.get("TXHUB_TOKEN", ""))
    s.add_argument("--port", type=int, default=9000)
    sub.add_parser("serve").add_argument("--port", type=int, default=9000)
    for name in ("place", "place-on-commit"):
        p = sub.add_parser(name)
        p.add_argument("order_id")
        p.add_argument("--crash-after-local-commit", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "setup":
        setup(args.admin_token, args.port)
    elif args.command == "serve":
        serve(args.port)
    elif args.command == "place":
        place(args.order_id, args.crash_after_local_commit)
    else:
        place_on_commit(args.order_id, args.crash_after_local_commit)


if __name__ == "__main__":
    main()
