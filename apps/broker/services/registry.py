"""Administration writes: topics, producer and consumer groups, API tokens."""

import functools
import hashlib
import secrets
from collections.abc import Callable, Collection
from typing import TypeVar

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.broker import access, config_cache, limits
from apps.broker.models import (
    ApiToken,
    AuditAction,
    ConsumerGroup,
    MessageQueue,
    ProducerGroup,
    Topic,
)
from apps.broker.services import clients, group_locks, retention
from apps.broker.services.audit import SYSTEM, Origin, audit_record, url_shown
from apps.broker.services.callbacks import callback_url_check, new_signing_secret
from apps.broker.services.credentials import new_access_key
from apps.broker.services.errors import Conflict, NotFound, invalid
from apps.broker.services.sending import RECEIVABLE_CHANNEL
from apps.broker.wakeups import GROUP_DELETED, REVOKED

TOKEN_PREFIX = "txh_"  # noqa: S105 - a public prefix, not a secret


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


T = TypeVar("T")


def _field_checked(field: str, check: Callable[[T], T], value: T) -> T:
    """`check(value)`, or the 400 about `field` every door answers with: the rules of what the
    registry stores are its own, whichever door called (docs/decisions/0106)."""
    try:
        return check(value)
    except limits.LimitError as error:
        raise invalid(field, str(error)) from None


def _name_checked(name: str) -> str:
    """A new topic's or group's name (limits.check_name)."""
    return _field_checked("name", functools.partial(limits.check_name, what="name"), name)


@transaction.atomic
def topic_create(*, name: str, queues: int) -> Topic:
    _name_checked(name)
    try:
        with transaction.atomic():
            topic = Topic.objects.create(name=name, queues=queues)
    except IntegrityError:
        raise Conflict(f"Topic {name!r} already exists.") from None
    MessageQueue.objects.bulk_create(
        MessageQueue(topic=topic, queue_id=queue_id) for queue_id in range(queues)
    )
    return topic


def producer_group_create(*, name: str, check_url: str = "") -> ProducerGroup:
    # No check URL: a group whose producers are RocketMQ clients, checked over their Telemetry
    # stream (with neither, a check is "unreachable": it backs off and uses no budget).
    _name_checked(name)
    if check_url:
        callback_url_check(check_url)
    try:
        return ProducerGroup.objects.create(
            name=name, check_url=check_url, signing_secret=new_signing_secret()
        )
    except IntegrityError:
        raise Conflict(f"Producer group {name!r} already exists.") from None


def producer_group_check_url_shown(*, group: ProducerGroup, may_change: bool) -> str:
    """A group's check URL as one reader may see it, at every door (docs/decisions/0079).

    Whole only to who may change it (the door's own guard of that change says so), which keeps
    an editor's form round-tripping the real credentials; to everyone else masked exactly as the
    audit records it (`url_shown`, decision 0039), since the URL may carry a producer's secret.
    """
    return group.check_url if may_change else url_shown(group.check_url)


def producer_group_update(*, name: str, check_url: str, origin: Origin = SYSTEM) -> ProducerGroup:
    # The URL's host is looked up (for up to TXHUB_CHECK_HTTP_TIMEOUT) before the transaction
    # opens, as at creation: a slow DNS holds no transaction or row lock (docs/decisions/0087).
    if check_url:
        callback_url_check(check_url)
    return _check_url_store(name=name, check_url=check_url, origin=origin)


@transaction.atomic  # a change the web processes cannot be told of is rolled back (503)
def _check_url_store(*, name: str, check_url: str, origin: Origin) -> ProducerGroup:
    """producer_group_update's write, its URL checked."""
    # Lock: the audit record's old URL is the one this change replaced, not one a concurrent
    # change replaced meanwhile.
    old = ProducerGroup.objects.select_for_update().filter(name=name).values("pk", "check_url")
    row = old.first()
    if row is None:
        raise NotFound(f"Producer group {name!r} does not exist.")
    ProducerGroup.objects.filter(pk=row["pk"]).update(
        check_url=check_url, updated_at=timezone.now()
    )
    if row["check_url"] != check_url:  # the same URL again records nothing (decision 0039)
        audit_record(
            action=AuditAction.CHECK_URL_CHANGE,
            origin=origin,
            target=name,
            detail={"old": url_shown(row["check_url"]), "new": url_shown(check_url)},
        )
    config_cache.changed()  # an UPDATE sends no signal
    return ProducerGroup.objects.get(pk=row["pk"])


@transaction.atomic
def producer_group_rotate_secret(*, name: str, origin: Origin = SYSTEM) -> ProducerGroup:
    # Lock: two rotations at once would both keep the same "previous" secret and lose one.
    group = ProducerGroup.objects.select_for_update().filter(name=name).first()
    if group is None:
        raise NotFound(f"Producer group {name!r} does not exist.")
    group.previous_signing_secret = group.signing_secret
    group.signing_secret = new_signing_secret()
    group.updated_at = group.secret_rotated_at = timezone.now()
    group.save(
        update_fields=[
            "previous_signing_secret",
            "signing_secret",
            "updated_at",
            "secret_rotated_at",
        ]
    )
    # Neither secret is recorded: only that it was rotated, by whom (docs/decisions/0039).
    audit_record(action=AuditAction.SECRET_ROTATE, origin=origin, target=name, detail={})
    return group


def consumer_group_create(
    *, name: str, max_delivery_attempts: int, consume_from: str, fifo: bool = False
) -> ConsumerGroup:
    """`fifo`: set once, at creation (docs/decisions/0054): turning it on or off under consumers
    that hold messages would make the order they were promised a different one."""
    _name_checked(name)
    try:
        return ConsumerGroup.objects.create(
            name=name,
            max_delivery_attempts=max_delivery_attempts,
            consume_from=consume_from,
            fifo=fifo,
        )
    except IntegrityError:
        raise Conflict(f"Consumer group {name!r} already exists.") from None


@transaction.atomic  # a change the web processes cannot be told of is rolled back (503)
def consumer_group_update(*, name: str, max_delivery_attempts: int) -> ConsumerGroup:
    """Takes effect at the next receive: deliveries over the new limit go to the DLQ then."""
    updated = ConsumerGroup.objects.filter(name=name).update(
        max_delivery_attempts=max_delivery_attempts
    )
    if not updated:
        raise NotFound(f"Consumer group {name!r} does not exist.")
    config_cache.changed()  # an UPDATE sends no signal
    return ConsumerGroup.objects.get(name=name)


# The deletion's statements, each by the group's id. Deliveries of every state go (acked history,
# in flight, held behind a FIFO head, dead-lettered), counted per state for the audit record.
_DELETE_DELIVERIES_SQL = """
WITH gone AS (DELETE FROM broker_delivery WHERE group_id = %s RETURNING state)
SELECT state, count(*) FROM gone GROUP BY state
"""
_DELETE_GROUP_ROWS_SQL = (
    "DELETE FROM broker_consumercursor WHERE group_id = %(id)s",
    "DELETE FROM broker_consumergroup_topics WHERE consumergroup_id = %(id)s",
    "DELETE FROM broker_consumergroup WHERE id = %(id)s",
)
# The group's scope leaves every token that names it, revoked or not (docs/decisions/0088): a
# later group of the same name is not theirs. Row locks in id order, so two deletions narrowing
# the same tokens wait for each other rather than deadlock. A token left with no scope stays.
_REMOVE_SCOPE_SQL = """
UPDATE broker_apitoken SET scopes = scopes - %(scope)s
WHERE id IN (
    SELECT id FROM broker_apitoken WHERE scopes @> jsonb_build_array(%(scope)s::text)
    ORDER BY id FOR UPDATE
)
RETURNING id
"""
# The group's consumers known to the gRPC door: a group of the same name does not show them.
_FORGET_CLIENTS_SQL = (
    "DELETE FROM broker_grpcclient WHERE \"group\" = %s AND client_type <> 'PRODUCER'"
)


@transaction.atomic  # all of it or nothing; a deletion the processes cannot be told of: 503
def consumer_group_delete(*, name: str, origin: Origin = SYSTEM) -> dict[str, int]:
    """Deletes the group with its cursors, deliveries (dead letters included), topic bindings and
    gRPC consumer rows, and removes its `consume:` scope from every token (docs/decisions/0088);
    returns how many deliveries of each state went. What it held of the commit log is the
    retention sweep's from then on (decision 0080)."""
    # Lock: waits for the group's receives under way; later ones find it gone (group_locks.py).
    group_id = group_locks.lock_for_delete(name=name)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT topic_id FROM broker_consumercursor WHERE group_id = %s "
            "ORDER BY topic_id",
            [group_id],
        )
        topic_ids = [row[0] for row in cursor.fetchall()]
        # Lock (advisory, shared): the retention sweep leaves these topics' rows alone until
        # this commits, so its deletion of acked deliveries never meets ours in a deadlock.
        for topic_id in topic_ids:
            retention.hold_for_new_cursors(topic_id=topic_id)
        cursor.execute(_DELETE_DELIVERIES_SQL, [group_id])
        deliveries = {str(state).lower(): int(count) for state, count in cursor.fetchall()}
        for statement in _DELETE_GROUP_ROWS_SQL:
            cursor.execute(statement, {"id": group_id})
        cursor.execute(_REMOVE_SCOPE_SQL, {"scope": access.scope_of("consume", name)})
        narrowed = sorted(int(row[0]) for row in cursor.fetchall())
        cursor.execute(_FORGET_CLIENTS_SQL, [name])
        audit_record(
            action=AuditAction.CONSUMER_GROUP_DELETE,
            origin=origin,
            target=name,
            detail={
                "deliveries": deliveries,
                "topics_read": len(topic_ids),
                "scope_removed_from_tokens": narrowed,
            },
        )
        # Raw writes send no signal: the processes' cached group and tokens go now (0026).
        config_cache.changed()
        # Its waiting receives, in every process, try again when this commits and are told
        # (apps/broker/wakeups.py).
        cursor.execute(
            "SELECT pg_notify(%s, %s)", [RECEIVABLE_CHANNEL, f"{GROUP_DELETED} {group_id}"]
        )
    return deliveries


# Shown in an error at most: an error body stays small however long the list was.
MISSING_SHOWN = 10


Group = TypeVar("Group", ProducerGroup, ConsumerGroup)


def _bind_topics(
    model: type[Group], *, name: str, topics: Collection[str], origin: Origin
) -> Group:
    """Replaces a group's topic bindings with `topics` (empty: unbound, any topic), or, if a
    group or topic does not exist, changes nothing."""
    what = "Producer" if model is ProducerGroup else "Consumer"
    wanted = set(topics)
    if len(wanted) > limits.MAX_BOUND_TOPICS:
        raise invalid(
            "topics", f"At most {limits.MAX_BOUND_TOPICS} topics can be bound to a group."
        )
    # Lock: two concurrent replacements would interleave their deletes and inserts and leave the
    # union of both lists; with the group's row locked the last one wins whole. NO KEY: the
    # group's receives (FOR KEY SHARE, group_locks.py) go on meanwhile (decision 0089).
    group = model.objects.select_for_update(no_key=True).filter(name=name).first()
    if group is None:
        raise NotFound(f"{what} group {name!r} does not exist.")
    found = list(Topic.objects.filter(name__in=wanted))
    missing = sorted(wanted - {topic.name for topic in found})
    if missing:
        raise NotFound(
            f"Topic {missing[0]!r} does not exist: nothing was bound.",
            topics=missing[:MISSING_SHOWN],
        )
    before = sorted(group.topics.values_list("name", flat=True))
    group.topics.set(found)
    if before != sorted(wanted):  # the same topics again record nothing (decision 0039)
        audit_record(
            action=AuditAction.TOPIC_BINDINGS_CHANGE,
            origin=origin,
            target=name,
            detail={"group": what.lower(), "old": before, "new": sorted(wanted)},
        )
    return group


@transaction.atomic
def producer_group_bind_topics(
    *, name: str, topics: Collection[str], origin: Origin = SYSTEM
) -> ProducerGroup:
    """The topics the group may send and prepare to (docs/decisions/0010)."""
    return _bind_topics(ProducerGroup, name=name, topics=topics, origin=origin)


@transaction.atomic
def consumer_group_bind_topics(
    *, name: str, topics: Collection[str], origin: Origin = SYSTEM
) -> ConsumerGroup:
    """The topics the group may receive from (docs/decisions/0010)."""
    return _bind_topics(ConsumerGroup, name=name, topics=topics, origin=origin)


@transaction.atomic  # the token and its audit record are stored together or not at all
def token_create(*, name: str, scopes: list[str], origin: Origin = SYSTEM) -> tuple[ApiToken, str]:
    """Returns the stored token and the raw token, which is never stored and shown only once."""
    # The name and scope rules hold at every door that makes a token: REST, console, commands.
    _field_checked("name", limits.check_token_name, name)
    scopes = _field_checked("scopes", limits.check_scopes, scopes)
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        name=name,
        token_hash=hash_token(raw),
        prefix=raw[:10],
        scopes=sorted(set(scopes)),
        access_key=new_access_key(),
    )
    # The id and scopes only: not the raw token, its hash or prefix (docs/decisions/0039).
    audit_record(
        action=AuditAction.TOKEN_CREATE,
        origin=origin,
        target=name,
        detail={"token_id": token.pk, "scopes": token.scopes},
    )
    return token, raw


@transaction.atomic  # a revocation the web processes cannot be told of is rolled back (503)
def token_revoke(*, token_id: int, origin: Origin = SYSTEM) -> None:
    # A token not revoked by now, a revocation scheduled for later included (decision 0108).
    now = timezone.now()
    revoked = ApiToken.objects.filter(access.not_revoked_by(now), id=token_id).update(
        revoked_at=now
    )
    name = ApiToken.objects.filter(id=token_id).values_list("name", flat=True).first()
    if name is None:
        raise NotFound(f"Token {token_id} does not exist.")
    # Its RocketMQ clients are forgotten with it, in this transaction (decision 0101).
    clients.token_clients_forget(token_id=token_id)
    if revoked:  # revoking a revoked token records nothing (decision 0039)
        audit_record(
            action=AuditAction.TOKEN_REVOKE,
            origin=origin,
            target=name,
            detail={"token_id": token_id},
        )
    # An UPDATE sends no signal. The web processes' cached tokens are stale from here on: a
    # revoked token fails at once (docs/decisions/0026); if they cannot be told, 503 and the
    # revocation is rolled back.
    config_cache.changed()
    # What the token holds open (waiting receives, Telemetry streams) ends in every process,
    # woken by their LISTEN hubs when this commits (apps/broker/wakeups.py, decision 0034).
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [RECEIVABLE_CHANNEL, f"{REVOKED} {token_id}"])
