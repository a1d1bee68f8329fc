"""The grpc.aio server: `python manage.py grpcserver` (scripts/run.sh starts it beside web).

Several may run on one port (SO_REUSEPORT, grpc's default on Linux): the kernel spreads
connections over them, and nothing a client needs lives in one process alone."""

import asyncio
import logging
import os
import signal
import socket
from pathlib import Path

import grpc
from django.conf import settings

from apps.broker import wakeups
from apps.broker.grpc import checks, handlers
from apps.broker.grpc.servicer import MessagingService

log = logging.getLogger("txhub.grpc")

# Bodies up to 4 MiB plus the protocol's envelope.
MAX_MESSAGE_BYTES = 5 * 1024 * 1024


def process_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def new_server(*, process: str) -> grpc.aio.Server:
    """The MessagingService on a grpc.aio server with its bounds, no port yet (a test serves the
    same one in its own process: tests/support/grpc_in_process.py)."""
    server = grpc.aio.server(
        # What one client or many may hold of this process (docs/decisions/0037).
        maximum_concurrent_rpcs=settings.TXHUB_GRPC_MAX_CONCURRENT_RPCS,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 1),
            # Clients keep one connection for hours; keepalive pings from them are welcome.
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.max_concurrent_streams", settings.TXHUB_GRPC_MAX_STREAMS_PER_CONNECTION),
            ("grpc.max_connection_idle_ms", 1000 * settings.TXHUB_GRPC_MAX_CONNECTION_IDLE_SECONDS),
            ("grpc.max_connection_age_ms", 1000 * settings.TXHUB_GRPC_MAX_CONNECTION_AGE_SECONDS),
            (
                "grpc.max_connection_age_grace_ms",
                1000 * settings.TXHUB_GRPC_MAX_CONNECTION_AGE_GRACE_SECONDS,
            ),
        ],
    )
    # Every RPC's handler, answering request bytes that are not its message (decision 0097).
    handlers.add_to_server(MessagingService(process=process), server)
    return server


async def serve(*, host: str, port: int) -> None:
    process = process_name()
    server = new_server(process=process)
    address = f"{host}:{port}"
    if settings.TXHUB_GRPC_TLS_CERT and settings.TXHUB_GRPC_TLS_KEY:
        credentials = grpc.ssl_server_credentials(
            [
                (
                    Path(settings.TXHUB_GRPC_TLS_KEY).read_bytes(),
                    Path(settings.TXHUB_GRPC_TLS_CERT).read_bytes(),
                )
            ]
        )
        server.add_secure_port(address, credentials)
        scheme = "TLS"
    else:
        server.add_insecure_port(address)
        scheme = "plaintext"
    await server.start()
    log.info("gRPC MessagingService on %s (%s), process %s", address, scheme, process)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    listener = asyncio.create_task(checks.listen(process=process))
    await stop.wait()
    listener.cancel()
    wakeups.hub().end_waits()  # waiting ReceiveMessage calls answer now, within the grace
    await server.stop(grace=5)
