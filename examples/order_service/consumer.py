"""Prints every "order created" message the shipping consumer group receives, and acks it.

python -m examples.order_service.consumer [--once]
"""

import argparse
import os

from txhub_client import ReceivedMessage, SimpleConsumer

from examples.order_service.service import TXHUB, config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--once", action="store_true", help="stop when nothing arrives for 3 s")
    args = parser.parse_args()
    consumer = SimpleConsumer(TXHUB, config()["token"], "shipping", topic="orders")

    def show(message: ReceivedMessage) -> None:
        body = (
            message.body.decode(errors="replace")
            if isinstance(message.body, bytes)
            else message.body
        )
        print(
            f"received: {body} (msg {message.msg_id}, attempt {message.delivery_attempt})",
            flush=True,
        )

    if not args.once:
        for _ in consumer.messages(show):
            pass
    while batch := consumer.receive(wait_seconds=3):
        for message in batch:
            show(message)
        consumer.ack(batch)
    os._exit(0)


if __name__ == "__main__":
    main()
