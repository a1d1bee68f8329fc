"""Message ids a producer chooses (a RocketMQ client's own ids) are scoped per producer group
(docs/decisions/0040).

txhub keeps one message id space (the REST API, the console and the consumers find a message by
its id), so a client-chosen id is stored as it is while no other producer group holds it. When
another group already holds it (by chance or by squatting), this group's message is stored under
an id derived from the group and the client's id with a keyed hash: deterministic, so a retry
finds what the first try stored; unpredictable without the server's key, so nobody can squat it
in turn. The producer is answered with the id its message was stored under, and nothing in any
answer says that another group used the id.
"""

from functools import cache

from django.db import connection
from django.utils.crypto import salted_hmac

from apps.broker.models import CommitLogEntry, DelayedMessage, HalfMessage

_SALT = "txhub.client-message-id"


def stored_id_for(*, client_id: str, producer_group: str) -> str:
    """The id under which `producer_group`'s message with the client's id `client_id` is, or
    will be, stored: the client's id unless another producer group's message holds it."""
    holder = _holder(client_id)
    if holder is None or holder == producer_group:
        return client_id
    return scoped_id(client_id=client_id, producer_group=producer_group)


@cache
def _held_sql() -> str:
    tables = [model._meta.db_table for model in (CommitLogEntry, DelayedMessage, HalfMessage)]
    # Our own tables' names, no input: nothing to inject.
    exists = [f'EXISTS (SELECT 1 FROM "{table}" WHERE msg_id = %s)' for table in tables]  # noqa: S608
    return "SELECT " + " OR ".join(exists)


def held(msg_id: str) -> bool:
    """Whether any message (a half message, a delayed message or a commit-log entry) is stored
    under `msg_id`: one plain statement. A fresh id, a client's every first send, is stored as
    it is and has no earlier message, so the sends and prepares ask this first and skip the
    lookups below, seven ORM queries (docs/decisions/0052)."""
    with connection.cursor() as cursor:
        cursor.execute(_held_sql(), [msg_id] * 3)
        row = cursor.fetchone()
    return bool(row and row[0])


def scoped_id(*, client_id: str, producer_group: str) -> str:
    """32 upper-case hex characters, the shape of txhub's own ids."""
    digest = salted_hmac(_SALT, f"{producer_group}\x00{client_id}", algorithm="sha256")
    return digest.hexdigest()[:32].upper()


def _holder(msg_id: str) -> str | None:
    """The producer group of the message stored under `msg_id` (a half message, a delayed
    message or a commit-log entry), or None. An id is unique across the three tables' uses."""
    half = HalfMessage.objects.filter(msg_id=msg_id).values_list("producer_group__name", flat=True)
    for model in (CommitLogEntry, DelayedMessage):
        found = model.objects.filter(msg_id=msg_id).values_list("producer_group", flat=True)
        name = found.first()
        if name is not None:
            return str(name)
    name = half.first()
    return None if name is None else str(name)
