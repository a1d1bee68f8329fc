"""Who may do what, for every door (docs/decisions/0046).

This module owns the principal (the API token behind a call, with its scopes), the revocation
rule, the meaning of a scope ("may produce to G", "may consume as C", "admin") and the topic
bindings of groups (docs/decisions/0010). The REST door (DRF's authentication and the views),
the lean door (which runs the same DRF classes) and the gRPC door only translate their
credentials into a lookup here (a bearer token's hash, a signed access key) and this module's
refusals into their protocol's codes. A rule changed here changes at every door.

Tokens and bindings are read through the per-process cache under the caller's configuration
epoch (config_cache.py, docs/decisions/0026), whichever door asks: a change of a token or a
binding makes a new epoch, so a revocation holds at once on every process of every door.
"""

import json
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple

from django.db import connection
from django.db.models import Q
from django.utils import timezone

from apps.broker import config_cache
from apps.broker.models import ConsumerGroup, Topic
from apps.broker.services.errors import Forbidden

Kind = Literal["produce", "consume"]
KINDS: tuple[Kind, ...] = ("produce", "consume")
ADMIN = "admin"  # every group of every kind, and the registry

# The revocation rule: a token is revoked once its `revoked_at` is set and not in the future (a
# future time is a scheduled revocation). `revoked` states it for a row read into Python,
# REVOKED_SQL for a query over broker_apitoken (the wake-up hub's catch-up, wakeups.py),
# `not_revoked_by` for the tokens a revocation may still revoke (registry.token_revoke).
REVOKED_SQL = "revoked_at IS NOT NULL AND revoked_at <= now()"


def revoked(revoked_at: datetime | None) -> bool:
    return revoked_at is not None and revoked_at <= timezone.now()


def not_revoked_by(moment: datetime) -> Q:
    """The same rule as a filter of tokens: those not revoked by `moment` (a revocation
    scheduled for later included: revoking such a token revokes it then, decision 0108)."""
    return Q(revoked_at__isnull=True) | Q(revoked_at__gt=moment)


def scope_of(kind: Kind, group: str) -> str:
    return f"{kind}:{group}"


@dataclass(frozen=True)
class Principal:
    """Who calls: a live token's id, name and scopes, at any door. `config_epoch` is the epoch
    read before the token was (the key of this call's cached lookups; None: read Postgres)."""

    token_id: int
    name: str
    scopes: frozenset[str]
    config_epoch: str | None = None
    is_authenticated: bool = True  # DRF reads the principal as `request.user`

    @property
    def is_admin(self) -> bool:
        return ADMIN in self.scopes

    def groups(self, kind: Kind) -> frozenset[str] | None:
        """The groups this token may use for `kind`; None means all (admin)."""
        if self.is_admin:
            return None
        return self.held(kind)

    def held(self, kind: Kind) -> frozenset[str]:
        """The groups named by this token's own `kind` scopes, admin or not."""
        prefix = scope_of(kind, "")
        return frozenset(s[len(prefix) :] for s in self.scopes if s.startswith(prefix))

    def can(self, kind: Kind, group: str) -> bool:
        allowed = self.groups(kind)
        return allowed is None or group in allowed

    def require(self, kind: Kind, group: str) -> None:
        """Forbidden unless the token has the scope for this group (or admin)."""
        if not self.can(kind, group):
            raise Forbidden(f"This token has no '{scope_of(kind, group)}' scope.")

    def require_some(self, kind: Kind) -> None:
        """Forbidden unless the token may use some group of `kind` (a large body's precheck)."""
        if self.groups(kind) == frozenset():
            raise Forbidden(f"This token has no '{kind}:' scope.")

    def require_admin(self) -> None:
        if not self.is_admin:
            raise Forbidden(f"This needs a token with the '{ADMIN}' scope.")

    def only_group(self, kind: Kind) -> str:
        """The token's single `kind` group (a RocketMQ producer names no group: its token's
        one `produce:<group>` scope is its group); Forbidden unless there is exactly one."""
        groups = sorted(self.held(kind))
        if len(groups) != 1:
            raise Forbidden(
                f"A RocketMQ producer's token must have exactly one '{scope_of(kind, '<group>')}' "
                f"scope: this one has {len(groups)}."
            )
        return groups[0]

    def require_topic(self, topic: str) -> None:
        """Forbidden unless the scopes cover `topic`: admin, or a `produce` / `consume` scope
        of a group that may use it (topic_allowed). The rule for what reveals a topic to a
        client that names no group of its own in the call (gRPC QueryRoute)."""
        if self.is_admin:
            return
        for kind in KINDS:
            for group in sorted(self.held(kind)):
                if group and _bound_allows(kind, group, topic, self.config_epoch):
                    return
        raise Forbidden(f"This token has no scope for a group that may use topic {topic!r}.")


# Tokens ------------------------------------------------------------------------------------


class _Token(NamedTuple):
    id: int
    name: str
    scopes: frozenset[str]
    revoked_at: datetime | None  # in the future: a scheduled revocation


def _token_where(
    column: Literal["token_hash", "access_key", "id"], value: str | int
) -> _Token | None:
    # Plain SQL: this runs on every call the cache cannot answer (decision 0026). `column` is
    # a constant, never input.
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, name, scopes, revoked_at FROM broker_apitoken WHERE {column} = %s",  # noqa: S608
            [value],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    scopes = row[2] if isinstance(row[2], list) else json.loads(row[2])
    return _Token(int(row[0]), str(row[1]), frozenset(str(s) for s in scopes), row[3])


def _live(token: _Token | None, epoch: str | None) -> Principal | None:
    if token is None or revoked(token.revoked_at):
        return None
    return Principal(token.id, token.name, token.scopes, config_epoch=epoch)


def by_token_hash(hashed: str, epoch: str | None) -> Principal | None:
    """The live token whose bearer secret hashes to `hashed` (REST and lean doors), from this
    process's cache under `epoch` or Postgres; None when unknown or revoked."""
    token = config_cache.read(epoch, ("token", hashed), lambda: _token_where("token_hash", hashed))
    return _live(token, epoch)


def by_access_key(access_key: str, epoch: str | None) -> Principal | None:
    """The live token of a RocketMQ access key (gRPC door, once its signature is verified:
    services/credentials.py), as `by_token_hash`."""
    token = config_cache.read(
        epoch, ("access_key", access_key), lambda: _token_where("access_key", access_key)
    )
    return _live(token, epoch)


def by_id(token_id: int | None) -> Principal | None:
    """The live token `token_id`, read from Postgres now (work that outlives the call that
    opened it: a stream's check-backs, a client id's owner)."""
    return None if token_id is None else _live(_token_where("id", token_id), None)


def kept_token_id(*, token_hash: str = "", access_key: str = "") -> int | None:
    """The id of a token this process keeps (under any epoch), or None: a hint of who a call
    is before its epoch is read (to count it in the same round trip; to let a known token
    past the failed-authentication throttle, docs/decisions/0038)."""
    key = ("token", token_hash) if token_hash else ("access_key", access_key)
    kept: _Token | None = config_cache.peek(key)
    return None if kept is None else kept.id


# Topic bindings (docs/decisions/0010) --------------------------------------------------------


def topic_allowed(*, kind: Kind, group: str, topic: str, epoch: str | None = None) -> None:
    """Forbidden if the group is bound to topics and `topic` is not one of them.

    The one check of topic bindings, for send, prepare and receive at every door. A group bound
    to nothing (or one that does not exist: the caller answers its 404 next) may use any topic.
    Whether the topic exists plays no part, so a 403 tells a bound group nothing about other
    topics.
    """
    if not _bound_allows(kind, group, topic, epoch):
        owner = _owner(kind)
        raise Forbidden(
            f"{owner.capitalize()} group {group!r} is not bound to topic {topic!r}.",
            **{f"{owner}_group": group, "topic": topic},
        )


def producer_group_visible(*, name: str, producer_groups: Collection[str] | None) -> bool:
    """Whether a caller whose produce scopes name `producer_groups` (None: every group, an admin
    or an operator) may see or resolve a transaction of the producer group `name`. What it may
    not see answers as if it did not exist (decision 0046)."""
    return producer_groups is None or name in producer_groups


def topic_readable(*, consumer_groups: Collection[str], topic: Topic) -> bool:
    """Whether one of these existing consumer groups may receive from `topic` (unbound, or
    bound to it): the same rule as topic_allowed, over several groups at once."""
    return (
        ConsumerGroup.objects.filter(name__in=consumer_groups)
        .filter(Q(topics__isnull=True) | Q(topics=topic))
        .exists()
    )


def _owner(kind: Kind) -> str:
    return "producer" if kind == "produce" else "consumer"


def _bound_allows(kind: Kind, group: str, topic: str, epoch: str | None) -> bool:
    owner = _owner(kind)
    names = config_cache.read(epoch, ("bound", owner, group), lambda: _bound_topics(owner, group))
    return not names or topic in names


def _bound_topics(owner: str, group: str) -> frozenset[str]:
    # One plain query; compared by the caller rather than in SQL, so a topic name from the URL
    # never reaches the database before it has been checked (a NUL byte, say, is simply not among
    # the names). Table names are constants.
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT t.name FROM broker_{owner}group_topics b "  # noqa: S608
            f"JOIN broker_{owner}group g ON g.id = b.{owner}group_id "
            "JOIN broker_topic t ON t.id = b.topic_id WHERE g.name = %s",
            [group],
        )
        return frozenset(row[0] for row in cursor.fetchall())
