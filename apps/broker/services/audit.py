"""The audit record: who changed access or configuration, when, what and from where.

Written by the write services themselves (registry, consuming), inside their database
transaction, so every door records once and a refused or rolled-back change records nothing
(docs/decisions/0039). The doors only say who is calling: `origin_of_request`, or `origin_of_cli`.
"""

import getpass
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from apps.broker.models import ActorKind, AuditAction, AuditRecord, Door

# REMOTE_ADDR as Django sees it; a longer one (a proxy's odd value) is cut, not refused.
ADDRESS_CHARS = 64


@dataclass(frozen=True)
class Origin:
    """Who is calling a write service, and through which door."""

    actor: str
    actor_kind: ActorKind
    door: Door
    address: str


# Code with no door (tests, benchmarks, scripts): the services' default, so a call that names no
# origin is still recorded, as "system". Every door passes its own (tests/broker/test_audit.py
# checks that each call from apps/ names one).
SYSTEM = Origin("system", ActorKind.SYSTEM, Door.SYSTEM, "")


class _Request(Protocol):
    """A Django HttpRequest or a DRF Request: both have these."""

    @property
    def META(self) -> dict[str, Any]: ...  # noqa: N802 - Django's name

    @property
    def user(self) -> Any: ...


def origin_of_request(request: _Request, *, door: Door) -> Origin:
    """The one reading of who made an HTTP request, for every HTTP door: the token's name on the
    REST door (request.user is a TokenUser there), the Django user name on the console and the
    admin; the client's address as Django sees it (REMOTE_ADDR: behind a proxy, the proxy's)."""
    user = request.user
    if door is Door.REST:
        actor, kind = str(user.name), ActorKind.TOKEN
    else:
        actor, kind = str(user.get_username()), ActorKind.OPERATOR
    address = str(request.META.get("REMOTE_ADDR") or "")[:ADDRESS_CHARS]
    return Origin(actor=actor, actor_kind=kind, door=door, address=address)


def origin_of_cli() -> Origin:
    """A management command: the operating system's user who ran it, if it can be told."""
    try:
        actor = getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (some containers)
        actor = "unknown"
    return Origin(actor=actor, actor_kind=ActorKind.CLI, door=Door.CLI, address="cli")


def audit_record(
    *, action: AuditAction, origin: Origin, target: str, detail: dict[str, Any]
) -> AuditRecord:
    """Call inside the change's own transaction.atomic, after the change was made: the record
    commits with the change or not at all. `detail` never holds a token or a secret."""
    return AuditRecord.objects.create(
        action=action,
        actor=origin.actor,
        actor_kind=origin.actor_kind,
        door=origin.door,
        address=origin.address,
        target=target,
        detail=detail,
    )


def url_shown(url: str) -> str:
    """A check URL as recorded: a password, a query or a fragment may hold a credential, so they
    are masked; the rest says where check-back calls."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
    query, fragment = ("***" if part else "" for part in (parts.query, parts.fragment))
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))
