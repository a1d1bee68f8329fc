"""RocketMQ clients known to the gRPC door: one row per client id (models.GrpcClient).

Written when a client says who it is (Telemetry settings, heartbeats) and when its stream opens
or closes; read by check-back (which process holds a producer's stream) and by the console.

A client id is chosen by the client, so it is owned: it belongs to the token that first used it
(docs/decisions/0034). Every write below goes through `_claim`, which refuses (Forbidden, and
changes nothing) a client id that another token holds, or a group other than the one it had."""

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from apps.broker.models import GrpcClient
from apps.broker.services.errors import Forbidden

# Said to an intruder: nothing about whose the id is.
NOT_YOURS = "This client id is in use by another client: choose another x-mq-client-id."


def _claim(client_id: str, token_id: int | None, group: str = "") -> GrpcClient | None:
    """The client's row, locked for this transaction, once it is known to be this token's (and,
    when it has a group, this group's); None if there is none yet. Forbidden otherwise."""
    # Lock: two calls with one client id (a stream opening while a heartbeat lands, or an
    # intruder racing the owner) decide ownership one after the other.
    row = GrpcClient.objects.select_for_update().filter(client_id=client_id).first()
    if row is None:
        return None
    if row.token_id is not None and row.token_id != token_id:
        raise Forbidden(NOT_YOURS)
    if group and row.group and row.group != group:
        raise Forbidden(NOT_YOURS)
    return row


def client_seen(*, client_id: str, token_id: int | None, **fields: Any) -> GrpcClient:
    """Creates or refreshes the client's row with what it said (settings, heartbeat)."""
    values = {k: v for k, v in fields.items() if v not in (None, "")}
    try:
        with transaction.atomic():
            row = _claim(client_id, token_id, values.get("group", ""))
            if row is None:
                return GrpcClient.objects.create(
                    client_id=client_id,
                    token_id=token_id,
                    **{"client_type": "UNKNOWN", **values},
                )
            for name, value in values.items():
                setattr(row, name, value)
            row.token_id, row.seen_at = token_id, timezone.now()
            row.save()
            return row
    except IntegrityError:  # created by another call meanwhile: decide against its row
        return client_seen(client_id=client_id, token_id=token_id, **fields)


def client_stream_opened(*, client_id: str, token_id: int, process: str) -> None:
    """Forbidden (nothing written) when the client id is another token's."""
    now = timezone.now()
    try:
        with transaction.atomic():
            row = _claim(client_id, token_id)
            if row is None:
                # A client this deployment has not heard from yet: it sends its settings next.
                GrpcClient.objects.create(
                    client_id=client_id,
                    client_type="UNKNOWN",
                    token_id=token_id,
                    stream_process=process,
                )
                return
            GrpcClient.objects.filter(pk=row.pk).update(
                stream_process=process, seen_at=now, connected_at=now, token_id=token_id
            )
    except IntegrityError:
        client_stream_opened(client_id=client_id, token_id=token_id, process=process)


def client_stream_closed(*, client_id: str, process: str) -> None:
    # Only if no newer stream of the same client (on another process) took over meanwhile.
    GrpcClient.objects.filter(client_id=client_id, stream_process=process).update(stream_process="")


def client_terminated(*, client_id: str, token_id: int | None) -> None:
    """The client says it is shutting down; Forbidden for another token's client id."""
    with transaction.atomic():
        row = _claim(client_id, token_id)
        if row is not None:
            GrpcClient.objects.filter(pk=row.pk).update(
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
