import asyncio
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Runs the RocketMQ 5 gRPC door (apache.rocketmq.v2.MessagingService)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=settings.TXHUB_GRPC_HOST)
        parser.add_argument("--port", type=int, default=settings.TXHUB_GRPC_PORT)

    def handle(self, *args: Any, **options: Any) -> None:
        from apps.broker.grpc.server import serve

        asyncio.run(serve(host=options["host"], port=options["port"]))
