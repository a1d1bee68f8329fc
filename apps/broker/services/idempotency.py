"""Idempotent retries (Stripe's `Idempotency-Key`): a producer whose send or prepare timed out
cannot know whether it was stored; retrying with the same key answers the first answer and stores
nothing. The key's row is written in the same database transaction as the message, so "stored"
and "remembered" cannot part (docs/decisions/0016)."""

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Now

from apps.broker import failpoints, limits
from apps.broker.clock import db_now
from apps.broker.models import IdempotencyKey, ProducerGroup
from apps.broker.services.errors import Conflict, invalid

HEADER = "Idempotency-Key"

INSERT_SQL = """
INSERT INTO broker_idempotencykey
    (producer_group_id, key, fingerprint, status, response, created_at)
VALUES (%s, %s, %s, 0, 'null', statement_timestamp())
ON CONFLICT ON CONSTRAINT idempotency_key_unique DO NOTHING
RETURNING id
"""


@dataclass(frozen=True)
class Answer:
    body: dict[str, Any]
    replayed: bool  # True: the first request's answer, nothing stored now


# The key row of a retry, locked, and whether it is still fresh by the database's clock
# (docs/decisions/0020): every web process compares against one clock.
EXISTING_SQL = """
SELECT id, fingerprint, response,
       created_at > statement_timestamp() - make_interval(secs => %s) AS fresh
FROM broker_idempotencykey WHERE producer_group_id = %s AND key = %s FOR UPDATE
"""


def key_of(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The one reading of the header from a request's raw headers, for both doors: the key,
    None without one. Refused (400): `Idempotency_Key` (an underscore form, which Django and
    most proxies drop silently: the retry would store twice) and a repeated header whose
    values differ (which key was meant?)."""
    found: set[str] = set()
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        if name == "idempotency_key":
            raise invalid(HEADER, f"Send the key as {HEADER} (with a hyphen), not {raw_name!r}.")
        if name == "idempotency-key":
            found.add(raw_value.decode("latin-1"))
    if len(found) > 1:
        raise invalid(HEADER, f"{HEADER} was sent more than once with different values.")
    return key_check(found.pop()) if found else None


def key_check(value: str) -> str:
    if not limits.IDEMPOTENCY_KEY_RE.fullmatch(value):
        raise invalid(HEADER, f"{HEADER} is 1 to 255 printable ASCII characters, no spaces.")
    return value


def fingerprint_of(*, method: str, path: str, data: Any) -> str:
    """The same request: the same method, path and JSON (key order and spacing do not count)."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(f"{method} {path}\n{canonical}".encode()).hexdigest()


def answer_once(
    *,
    group: ProducerGroup,
    key: str,
    fingerprint: str,
    status: int,
    run: Callable[[], dict[str, Any]],
    failpoint: str,
) -> Answer:
    """Runs `run` (which stores something and returns the answer's body) at most once per key
    and producer group within TXHUB_IDEMPOTENCY_TTL. Errors raised by `run` store nothing, the
    key included, so a retry after an error runs again."""
    with transaction.atomic():
        # Lock: the unique index on (group, key). A retry racing the first request waits in this
        # INSERT until the first one commits, then finds its row and answers it: never two stores.
        with connection.cursor() as cursor:
            cursor.execute(INSERT_SQL, [group.pk, key, fingerprint])
            inserted = cursor.fetchone()
        if inserted is None:
            # Lock: the row, so an expired key is taken over by one request only.
            with connection.cursor() as cursor:
                ttl = float(settings.TXHUB_IDEMPOTENCY_TTL)
                cursor.execute(EXISTING_SQL, [ttl, group.pk, key])
                key_id, existing_fingerprint, response, fresh = cursor.fetchone()
            if fresh:
                if existing_fingerprint != fingerprint:
                    raise Conflict(
                        f"This {HEADER} was used for a different request in the last "
                        f"{settings.TXHUB_IDEMPOTENCY_TTL / 3600:g} h; use a new key.",
                        idempotency_key=key,
                    )
                stored = json.loads(response) if isinstance(response, str) else response
                return Answer(dict(stored), replayed=True)
        else:
            key_id = inserted[0]
        if failpoints.ARMED:
            failpoints.hit("after_idempotency_key_read")
        body = run()
        IdempotencyKey.objects.filter(pk=key_id).update(
            fingerprint=fingerprint, status=status, response=body, created_at=Now()
        )
    if failpoints.ARMED:
        failpoints.hit_after_commit(failpoint)
    return Answer(body, replayed=False)


def idempotency_sweep(*, batch: int = 5000) -> int:
    """Forgets keys older than TXHUB_IDEMPOTENCY_TTL, in batches."""
    cutoff = db_now() - timedelta(seconds=settings.TXHUB_IDEMPOTENCY_TTL)
    deleted = 0
    while True:
        ids = list(
            IdempotencyKey.objects.filter(created_at__lt=cutoff).values_list("id", flat=True)[
                :batch
            ]
        )
        if not ids:
            return deleted
        deleted += IdempotencyKey.objects.filter(id__in=ids).delete()[0]
