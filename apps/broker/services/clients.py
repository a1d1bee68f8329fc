"""RocketMQ clients known to the gRPC door: one row per client id (models.GrpcClient).

Written when a client says who it is (Telemetry settings, heartbeats) and when its stream opens
or closes; read by check-back (which process holds a producer's stream) and by the console."""

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from apps.broker.models import GrpcClient


def client_seen(*, client_id: str, token_id: int | None, **fields: Any) -> GrpcClient:
    """Creates or refreshes the client's row with what it said (settings, heartbeat)."""
    values = {k: v for k, v in fields.items() if v not in (None, "")}
    client, _ = GrpcClient.objects.update_or_create(
        client_id=client_id,
        defaults={**values, "token_id": token_id, "seen_at": timezone.now()},
        create_defaults={
            **values,
            "token_id": token_id,
            "client_type": values.get("client_type") or "UNKNOWN",
        },
    )
    return client


def client_stream_opened(*, client_id: str, token_id: int, process: str) -> None:
    now = timezone.now()
    updated = GrpcClient.objects.filter(client_id=client_id).update(
        stream_process=process, seen_at=now, connected_at=now, token_id=token_id
    )
    if not updated:
        # A client this deployment has not heard from yet: it sends its settings next.
        GrpcClient.objects.create(
            client_id=client_id, client_type="UNKNOWN", token_id=token_id, stream_process=process
        )


def client_stream_closed(*, client_id: str, process: str) -> None:
    # Only if no newer stream of the same client (on another process) took over meanwhile.
    GrpcClient.objects.filter(client_id=client_id, stream_process=process).update(stream_process="")


def client_terminated(*, client_id: str) -> None:
    GrpcClient.objects.filter(client_id=client_id).update(
        stream_process="", seen_at=timezone.now() - timedelta(days=1)
    )


def clients_connected(*, group: str | None = None) -> QuerySet[GrpcClient]:
    """Clients with a stream open, or seen within TXHUB_GRPC_CLIENT_TTL."""
    recent = timezone.now() - timedelta(seconds=settings.TXHUB_GRPC_CLIENT_TTL)
    rows = GrpcClient.objects.filter(seen_at__gte=recent).exclude(client_type="UNKNOWN")
    if group is not None:
        rows = rows.filter(group=group)
    return rows.order_by("group", "connected_at")


def producers_with_stream(*, group: str, topic: str) -> list[GrpcClient]:
    """Producers of `group` whose Telemetry stream is open on some gRPC process, those that
    publish `topic` first (a producer that never named its topics may still check it)."""
    recent = timezone.now() - timedelta(seconds=settings.TXHUB_GRPC_CLIENT_TTL)
    rows = list(
        GrpcClient.objects.filter(group=group, client_type="PRODUCER", seen_at__gte=recent).exclude(
            stream_process=""
        )
    )
    return sorted(rows, key=lambda c: (topic not in c.topics, -c.seen_at.timestamp()))
