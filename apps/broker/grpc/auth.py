"""Who calls: RocketMQ 5's signed metadata (`authorization: MQv2-HMAC-SHA1 Credential=<ak>,
SignedHeaders=x-mq-date-time, Signature=<hex>`), checked against the token's derived secret key,
and the scope checks of CONTRACT section 3 in the protocol's codes."""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from apps.broker.grpc.protocol import Code, Refusal
from apps.broker.services import credentials

_AUTHORIZATION = re.compile(
    r"MQv2-HMAC-SHA1 Credential=(?P<ak>[^,\s]{1,64}), ?SignedHeaders=x-mq-date-time, ?"
    r"Signature=(?P<sig>[0-9A-Fa-f]{40})"
)


@dataclass(frozen=True)
class Caller:
    """A signed call: the token behind it and what the client says about itself."""

    principal: credentials.Principal
    client_id: str
    language: str
    version: str

    @property
    def is_admin(self) -> bool:
        return "admin" in self.principal.scopes

    def groups(self, kind: str) -> frozenset[str] | None:
        if self.is_admin:
            return None
        prefix = kind + ":"
        return frozenset(s[len(prefix) :] for s in self.principal.scopes if s.startswith(prefix))

    def require(self, kind: str, group: str) -> None:
        allowed = self.groups(kind)
        if allowed is not None and group not in allowed:
            raise Refusal(Code.FORBIDDEN, f"This token has no '{kind}:{group}' scope.")

    def producer_group(self) -> str:
        """A gRPC producer's group: its token's single `produce:<group>` scope (RocketMQ 5
        producers name no group)."""
        prefix = "produce:"
        groups = sorted(s[len(prefix) :] for s in self.principal.scopes if s.startswith(prefix))
        if len(groups) != 1:
            raise Refusal(
                Code.FORBIDDEN,
                "A RocketMQ producer's token must have exactly one 'produce:<group>' scope: "
                f"this one has {len(groups)}.",
            )
        return groups[0]


def metadata_of(context: Any) -> dict[str, str]:
    return {
        key: value if isinstance(value, str) else value.decode("latin-1")
        for key, value in (context.invocation_metadata() or ())
    }


def caller_of(metadata: Mapping[str, str]) -> Caller:
    """The signed caller, or UNAUTHORIZED. Reads the token's row (a revoked token fails at
    once): run it off the event loop."""
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
    principal = credentials.principal_for(
        access_key=match["ak"], date_time=date_time, signature=match["sig"]
    )
    if principal is None:
        raise Refusal(
            Code.UNAUTHORIZED, "The access key is unknown or revoked, or the signature is wrong."
        )
    return Caller(
        principal=principal,
        client_id=metadata.get("x-mq-client-id", "")[:255],
        language=metadata.get("x-mq-language", "")[:32],
        version=metadata.get("x-mq-client-version", "")[:64],
    )
