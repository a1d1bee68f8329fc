import asyncio
from typing import Any

import uvloop
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Runs the RocketMQ 5 gRPC door (apache.rocketmq.v2.MessagingService)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=settings.TXHUB_GRPC_HOST)
        parser.add_argument("--port", type=int, default=settings.TXHUB_GRPC_PORT)

    def handle(self, *args: Any, **options: Any) -> None:
        from apps.broker.grpc.server import serve

        # uvloop, as the web tier's uvicorn workers: grpc.aio runs on any asyncio loop, and
        # uvloop's turn, hop to the executor and wake-up cost less per call (decision 0059).
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(host=options["host"], port=options["port"]))
