"""Who calls: RocketMQ 5's signed metadata (`authorization: MQv2-HMAC-SHA1 Credential=<ak>,
SignedHeaders=x-mq-date-time, Signature=<hex>`), checked against the token's derived secret key,
and handed to the access module, which says whose it is and what it may do (docs/decisions/0046).
The scope checks are the access module's; its refusals (Forbidden) become FORBIDDEN in the
servicers' error mapping (protocol.refusal_of)."""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from apps.broker import access, limits
from apps.broker.api.throttling import Counted, epoch_and_count
from apps.broker.grpc.protocol import Code, Refusal, client_refusal
from apps.broker.services import credentials

_AUTHORIZATION = re.compile(
    r"MQv2-HMAC-SHA1 Credential=(?P<ak>[^,\s]{1,64}), ?SignedHeaders=x-mq-date-time, ?"
    r"Signature=(?P<sig>[0-9A-Fa-f]{40})"
)


@dataclass(frozen=True)
class Caller:
    """A signed call: the token behind it and what the client says about itself."""

    principal: access.Principal
    client_id: str
    language: str
    version: str


def metadata_of(context: Any) -> dict[str, str]:
    return {
        key: value if isinstance(value, str) else value.decode("latin-1")
        for key, value in (context.invocation_metadata() or ())
    }


def caller_of(metadata: Mapping[str, str]) -> tuple[Caller, Counted | None]:
    """The signed caller, or UNAUTHORIZED: the signature checked here (docs/decisions/0022,
    0035), the token looked up by the access module under the current configuration epoch, as
    the REST door's (docs/decisions/0046); with this call's count against the token's rate
    limit when it was made in the epoch's round trip (None: count it). Its language and version
    headers, past the widths the settings are held to: BAD_REQUEST. Reads Redis and maybe
    Postgres: run it off the event loop."""
    match = _AUTHORIZATION.fullmatch(metadata.get("authorization", "").strip())
    date_time = metadata.get("x-mq-date-time", "")
    if match is None or not date_time or len(date_time) > 64:
        raise Refusal(
            Code.UNAUTHORIZED,
            "Sign requests with an access key and secret key (MQv2-HMAC-SHA1 over "
            "x-mq-date-time): create a token to get them.",
        )
    if not credentials.signed_recently(date_time):
        raise Refusal(
            Code.UNAUTHORIZED,
            "x-mq-date-time is not the server's time within "
            f"{settings.TXHUB_GRPC_SIGNATURE_MAX_SKEW_SECONDS:.0f} s (UTC, yyyyMMddTHHmmssZ): "
            "check the client's clock.",
        )
    principal, counted = None, None
    if credentials.signature_valid(
        access_key=match["ak"], date_time=date_time, signature=match["sig"]
    ):
        # The epoch first, as the REST door's auth: a token revoked before it was read is
        # loaded anew (config_cache.py), so a revocation holds at once on every process.
        epoch, counted = epoch_and_count(access.kept_token_id(access_key=match["ak"]))
        principal = access.by_access_key(match["ak"], epoch)
    if principal is None:
        raise Refusal(
            Code.UNAUTHORIZED, "The access key is unknown or revoked, or the signature is wrong."
        )
    language = metadata.get("x-mq-language", "")
    version = metadata.get("x-mq-client-version", "")
    try:
        # The settings' rule for the same values, never a cut (docs/decisions/0076).
        limits.check_client_texts(language=language, version=version)
    except limits.LimitError as error:
        raise client_refusal(error) from None
    caller = Caller(
        principal=principal,
        # Never cut: a client id too long for its row is refused where rows are written
        # (services/clients.client_claim), not merged with another that shares its prefix.
        client_id=metadata.get("x-mq-client-id", ""),
        language=language,
        version=version,
    )
    return caller, counted
