"""Bearer-token authentication and the contract's scopes."""

import json
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from django.conf import settings
from django.db import connection
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from apps.broker import config_cache
from apps.broker.api import failed_auth
from apps.broker.api.throttling import COUNTED, Counted, TokenRateThrottle
from apps.broker.services.registry import hash_token


@dataclass(frozen=True)
class TokenUser:
    """The principal behind a request: a token's name and scopes."""

    token_id: int
    name: str
    scopes: frozenset[str]
    is_authenticated: bool = True
    # The configuration epoch read at the start of this request: the selectors' cache key
    # (apps/broker/config_cache.py). None: read everything from Postgres.
    config_epoch: str | None = None

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes

    def groups(self, kind: str) -> frozenset[str] | None:
        """The groups this token may use for `kind` (produce/consume); None means all (admin)."""
        if self.is_admin:
            return None
        prefix = kind + ":"
        return frozenset(s[len(prefix) :] for s in self.scopes if s.startswith(prefix))

    def can(self, kind: str, group: str) -> bool:
        allowed = self.groups(kind)
        return allowed is None or group in allowed


class BearerTokenAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[TokenUser, int] | None:
        raw = bearer_of(get_authorization_header(request))
        if raw is None:
            return None
        hashed = hash_token(raw)
        address = request.META.get("REMOTE_ADDR", "")
        refuse_early(hashed, address)
        # The epoch first: a token revoked before it was read is loaded anew (config_cache.py),
        # so a revocation holds at once on every web process.
        epoch = _epoch_and_count(request, hashed)
        user = user_of(hashed, epoch, address=address)
        return user, user.token_id

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="txhub"'


def bearer_of(authorization: bytes) -> str | None:
    """The raw token of an `Authorization: Bearer <token>` header; None when there is no bearer
    header at all; AuthenticationFailed when the header is malformed."""
    parts = authorization.split()
    if not parts or parts[0].lower() != b"bearer":
        return None
    if len(parts) != 2:
        raise exceptions.AuthenticationFailed("The Authorization header must be 'Bearer <token>'.")
    return parts[1].decode("latin-1")


def refuse_early(hashed: str, address: str) -> None:
    """Before any Redis or Postgres work (docs/decisions/0038): a token found bad recently is
    refused again at once, and an address past its failed authentications is throttled unless
    its token is one this process already knows as good."""
    if failed_auth.known_bad(hashed):
        raise exceptions.AuthenticationFailed(UNKNOWN_TOKEN)
    wait = failed_auth.over_budget(address)
    if wait is not None and config_cache.peek(("token", hashed)) is None:
        raise exceptions.Throttled(wait=wait, detail="Too many failed authentications.")


UNKNOWN_TOKEN = "The token is unknown or revoked."  # noqa: S105 - a message, not a secret


def user_of(hashed: str, epoch: str | None, *, address: str = "") -> TokenUser:
    """The one token lookup of every HTTP door: the token behind a hash, from this process's
    cache under `epoch` or Postgres; AuthenticationFailed when unknown or revoked (and the
    failure is remembered, docs/decisions/0038)."""
    token = config_cache.read(epoch, ("token", hashed), lambda: _token_by_hash(hashed))
    if token is None or (token.revoked_at is not None and token.revoked_at <= timezone.now()):
        failed_auth.failed(hashed, address)
        raise exceptions.AuthenticationFailed(UNKNOWN_TOKEN)
    return TokenUser(token.id, token.name, token.scopes, config_epoch=epoch)


def bearer_user(authorization: bytes, address: str = "") -> TokenUser:
    """For a door outside DRF's request cycle (the web tier's body gate): the header's token,
    or AuthenticationFailed (no bearer header included) or Throttled. Counts no request against
    the rate limit: the view that answers the request does."""
    raw = bearer_of(authorization)
    if raw is None:
        raise exceptions.NotAuthenticated("Authentication credentials were not provided.")
    hashed = hash_token(raw)
    refuse_early(hashed, address)
    return user_of(hashed, config_cache.current(), address=address)


def _epoch_and_count(request: Request, hashed: str) -> str | None:
    """The configuration epoch; for a token this process knows already, read in one Redis round
    trip with the throttle's count of this request (which the throttle then uses): one round
    trip per request instead of two. The count is made for the id the token had when kept; the
    id of a token never changes, and a request that turns out unauthenticated is not throttled."""
    known: _Token | None = config_cache.peek(("token", hashed))
    if known is None or settings.TXHUB_THROTTLE_CACHE != "default":
        return config_cache.current()
    throttle = TokenRateThrottle()
    counting: list[bool] = []
    epoch, results = config_cache.current_with(
        lambda pipeline: counting.append(throttle.count_in(pipeline, known.id))
    )
    if results and counting and counting[0]:
        counted = Counted(known.id, int(results[0]), throttle.now)
        setattr(request, COUNTED, counted)
    return epoch


class _Token(NamedTuple):
    id: int
    name: str
    scopes: frozenset[str]
    revoked_at: datetime | None  # in the future: a scheduled revocation


def _token_by_hash(hashed: str) -> _Token | None:
    # Plain SQL: this runs on every request the cache cannot answer (decision 0026).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, name, scopes, revoked_at FROM broker_apitoken WHERE token_hash = %s",
            [hashed],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    scopes = row[2] if isinstance(row[2], list) else json.loads(row[2])
    return _Token(row[0], row[1], frozenset(scopes), row[3])


def require(request: Request, kind: str, group: str) -> TokenUser:
    """403 unless the token has the scope for this group (or admin)."""
    user: TokenUser = request.user  # type: ignore[assignment]
    if not user.can(kind, group):
        raise exceptions.PermissionDenied(f"This token has no '{kind}:{group}' scope.")
    return user


def require_admin(request: Request) -> TokenUser:
    user: TokenUser = request.user  # type: ignore[assignment]
    if not user.is_admin:
        raise exceptions.PermissionDenied("This needs a token with the 'admin' scope.")
    return user
