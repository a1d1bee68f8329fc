"""The REST door's credentials: a bearer token, hashed and handed to the access module, whose
principal becomes `request.user` (docs/decisions/0046). Its refusals in DRF's terms: 401, 429."""

from typing import Any

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from apps.broker import access, config_cache
from apps.broker.api import failed_auth
from apps.broker.api.throttling import COUNTED, epoch_and_count
from apps.broker.services.registry import hash_token

# The principal of a REST or lean-door request (`request.user`): the access module's, as at
# every door (docs/decisions/0046).
TokenUser = access.Principal


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


def client_address(scope: Any) -> str:
    """The client's address as every door reads it from the ASGI scope (Django's REMOTE_ADDR
    is the same value): failed authentications are counted per address (decision 0038)."""
    client = scope.get("client")
    return str(client[0]) if client else ""


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
    if wait is not None and access.kept_token_id(token_hash=hashed) is None:
        raise exceptions.Throttled(wait=wait, detail="Too many failed authentications.")


UNKNOWN_TOKEN = "The token is unknown or revoked."  # noqa: S105 - a message, not a secret


def user_of(hashed: str, epoch: str | None, *, address: str = "") -> TokenUser:
    """The principal behind a bearer token's hash (access.by_token_hash);
    AuthenticationFailed when unknown or revoked (and the failure is remembered,
    docs/decisions/0038)."""
    principal = access.by_token_hash(hashed, epoch)
    if principal is None:
        failed_auth.failed(hashed, address)
        raise exceptions.AuthenticationFailed(UNKNOWN_TOKEN)
    return principal


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
    """The configuration epoch, read with this request's count when the token is one this
    process knows (throttling.epoch_and_count); the throttle then uses that count."""
    epoch, counted = epoch_and_count(access.kept_token_id(token_hash=hashed))
    if counted is not None:
        setattr(request, COUNTED, counted)
    return epoch


def require(request: Request, kind: access.Kind, group: str) -> TokenUser:
    """The request's principal; 403 unless it may use `group` for `kind` (access module)."""
    user: TokenUser = request.user  # type: ignore[assignment]
    user.require(kind, group)
    return user


def require_admin(request: Request) -> TokenUser:
    user: TokenUser = request.user  # type: ignore[assignment]
    user.require_admin()
    return user
