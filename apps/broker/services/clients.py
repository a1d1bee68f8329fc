"""RocketMQ clients known to the gRPC door: one row per token and client id (models.GrpcClient).

Written when a client says who it is (Telemetry settings, heartbeats) and when its stream opens
or closes; read by check-back (which process holds a producer's stream) and by the console.

Two rules live here and nowhere else (docs/decisions/0034): a client id is scoped to the token
that uses it, so one id under two tokens is two clients and no token can take or learn of
another's (decision 0100), and belongs to its group (`client_claim`, called by every write that
makes or changes a client row, which also refuses a blank or over-long id:
limits.check_client_id); a check is sent on a stream only while the stream's token holds
`produce:<group>` of the transaction (`stream_may_check`, read when the check is forwarded).
Every lookup by client id here takes the caller's token too.

A token has a row only for a client that established itself (a Heartbeat, Telemetry settings, a
stream opened) and has not left: a goodbye deletes the client's row and stores nothing for an id
the token has none of, and revoking the token deletes all of its rows (decision 0101)."""

from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from apps.broker import access, limits
from apps.broker.models import GrpcClient
from apps.broker.services.errors import Forbidden, Unauthenticated

# The advisory lock (this class, a token id) under which a token's client ids are counted before
# one more is taken: two claims of new ids at once would both count one below the cap and both
# insert (decision 0084). The two-int form cannot meet the one-bigint locks elsewhere.
TOKEN_CLIENTS_LOCK = 0x7478_636C  # "txcl"


def _lock_token_clients(token_id: int) -> None:
    """TOKEN_CLIENTS_LOCK of the token, held to the end of the caller's transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s::int)", [TOKEN_CLIENTS_LOCK, token_id])


def _count_token_clients(token_id: int) -> None:
    """limits.check_token_clients on the token's client ids not yet forgotten; in the claim's
    transaction, holding TOKEN_CLIENTS_LOCK to its end. A token revoked since its caller was
    authenticated is Unauthenticated: read after the lock, so a revocation that committed
    meanwhile (and deleted the token's rows under the same lock) is seen (decision 0101)."""
    _lock_token_clients(token_id)
    if access.by_id(token_id) is None:
        raise Unauthenticated("The access key was revoked.")
    forgotten = timezone.now() - timedelta(seconds=settings.TXHUB_GRPC_CLIENT_FORGET_SECONDS)
    live = GrpcClient.objects.filter(token_id=token_id, seen_at__gte=forgotten).count()
    limits.check_token_clients(live)


def client_claim(*, client_id: str, token_id: int, group: str = "") -> GrpcClient:
    """The row of the caller's token's client `client_id`, locked; call inside
    `transaction.atomic()`. A new id is a new client of the token's, whether or not another token
    uses the same id (decision 0100). An id the token uses for another group is refused
    (Forbidden) and nothing changes. A blank or over-long id is refused (limits.LimitError, field
    `client_id`) before anything is read, and so is a new id of a token that has
    TXHUB_GRPC_MAX_CLIENTS_PER_TOKEN (decision 0084), or of a token revoked meanwhile
    (Unauthenticated, decision 0101)."""
    limits.check_client_id(client_id)
    for _ in range(2):
        # Lock: two calls of the token creating the same new id at once; the second waits for
        # the first and sees its row.
        row = (
            GrpcClient.objects.select_for_update()
            .filter(token_id=token_id, client_id=client_id)
            .first()
        )
        if row is not None:
            break
        _count_token_clients(token_id)
        try:
            with transaction.atomic():
                return GrpcClient.objects.create(
                    client_id=client_id, client_type="UNKNOWN", token_id=token_id, group=group
                )
        except IntegrityError:
            continue  # created meanwhile by another call of the token: read it, locked
    else:
        raise Forbidden("This client id is in use by another client of this token.")
    if group and row.group and row.group != group:
        raise Forbidden(f"This client id is used for group {row.group!r}, not {group!r}.")
    return row


def client_seen(
    *,
    client_id: str,
    token_id: int,
    client_type: str,
    group: str = "",
    topics: list[str] | None = None,
    language: str = "",
    version: str = "",
    hostname: str = "",
) -> GrpcClient:
    """Creates or refreshes the client's row with what it said (settings, heartbeat), once all of
    it passed limits.check_client (else limits.LimitError, nothing stored). A blank text (or topics
    None) leaves what the row holds."""
    limits.check_client(
        client_type=client_type,
        topics=topics or [],
        language=language,
        version=version,
        hostname=hostname,
    )
    said = {"language": language, "version": version, "hostname": hostname}
    with transaction.atomic():
        client = client_claim(client_id=client_id, token_id=token_id, group=group)
        client.client_type = client_type
        if group:
            client.group = group
        if topics is not None:
            client.topics = topics
        for name, value in said.items():
            if value:
                setattr(client, name, value)
        client.seen_at = timezone.now()
        client.save()
    return client


def client_stream_opened(*, client_id: str, token_id: int, process: str) -> None:
    """Raises Forbidden when the id is not the caller's (client_claim)."""
    now = timezone.now()
    with transaction.atomic():
        client = client_claim(client_id=client_id, token_id=token_id)
        client.stream_process, client.seen_at, client.connected_at = process, now, now
        client.save()


def client_stream_closed(*, client_id: str, token_id: int, process: str) -> None:
    # Only if no newer stream of the same client (on another process) took over meanwhile.
    GrpcClient.objects.filter(
        token_id=token_id, client_id=client_id, stream_process=process
    ).update(stream_process="")


def client_terminated(*, client_id: str, token_id: int) -> None:
    """A client's goodbye: its row is deleted, so it is asked no check and frees its place under
    TXHUB_GRPC_MAX_CLIENTS_PER_TOKEN at once. An id the token has no row of is no client of the
    token's: nothing is stored and the goodbye is answered as any other (decision 0101). A blank
    or over-long id is refused (limits.LimitError), as every call that names one."""
    limits.check_client_id(client_id)
    GrpcClient.objects.filter(token_id=token_id, client_id=client_id).delete()


def token_clients_forget(*, token_id: int) -> int:
    """Deletes every client row of a token being revoked, in the revocation's transaction (a
    revoked token calls nothing more: its rows would only wait for the sweep); returns how many.
    Under TOKEN_CLIENTS_LOCK: a claim of a new id by a call authenticated just before the
    revocation either finishes first, and its row is deleted here, or comes after and finds the
    token revoked (decision 0101)."""
    _lock_token_clients(token_id)
    deleted, _ = GrpcClient.objects.filter(token_id=token_id).delete()
    return deleted


def stream_may_check(*, token_id: int, producer_group: str) -> bool:
    """Whether a check of a transaction of `producer_group` may be sent on a stream opened with
    this token: read when the check is forwarded, so a token revoked or narrowed since the
    stream opened receives nothing."""
    principal = access.by_id(token_id)
    # The scope itself, not admin's "every group": a stream's producer is its one group's.
    return principal is not None and producer_group in principal.held("produce")


def clients_sweep(*, batch: int = 1000) -> int:
    """Deletes the rows of clients not seen (no heartbeat, no call) for longer than
    TXHUB_GRPC_CLIENT_FORGET_SECONDS, in batches; returns how many. A live client refreshes its
    row every few seconds, so a row this old is a client gone (a crash leaves its stream process
    set): its id may be claimed again (docs/decisions/0034)."""
    cutoff = timezone.now() - timedelta(seconds=settings.TXHUB_GRPC_CLIENT_FORGET_SECONDS)
    total = 0
    while True:
        ids = list(
            GrpcClient.objects.filter(seen_at__lt=cutoff).values_list("pk", flat=True)[:batch]
        )
        if not ids:
            return total
        deleted, _ = GrpcClient.objects.filter(pk__in=ids, seen_at__lt=cutoff).delete()
        total += deleted


def clients_connected(*, group: str | None = None) -> QuerySet[GrpcClient]:
    """Clients with a stream open, or seen within TXHUB_GRPC_CLIENT_TTL, with their tokens (one
    id under two tokens is two clients, decision 0100)."""
    recent = timezone.now() - timedelta(seconds=settings.TXHUB_GRPC_CLIENT_TTL)
    rows = (
        GrpcClient.objects.select_related("token")
        .filter(seen_at__gte=recent)
        .exclude(client_type="UNKNOWN")
    )
    if group is not None:
        rows = rows.filter(group=group)
    return rows.order_by("group", "connected_at")


def producers_with_stream(*, group: str, topic: str) -> list[GrpcClient]:
    """Producers of `group` whose Telemetry stream is open on some gRPC process and whose token
    may receive a check of the group now (`stream_may_check`: a stream of a token revoked or
    narrowed since it opened would refuse the check and waste the round, every round, while
    another producer could answer), those that publish `topic` first (a producer that never
    named its topics may still check it)."""
    recent = timezone.now() - timedelta(seconds=settings.TXHUB_GRPC_CLIENT_TTL)
    streams = list(
        GrpcClient.objects.filter(group=group, client_type="PRODUCER", seen_at__gte=recent).exclude(
            stream_process=""
        )
    )
    # Each token read once, however many of its clients hold a stream.
    tokens = {row.token_id for row in streams if row.token_id is not None}
    may_check: dict[int | None, bool] = {
        token: stream_may_check(token_id=token, producer_group=group) for token in tokens
    }
    rows = [row for row in streams if may_check.get(row.token_id, False)]
    return sorted(rows, key=lambda c: (topic not in c.topics, -c.seen_at.timestamp()))
