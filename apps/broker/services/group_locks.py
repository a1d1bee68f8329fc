"""The one lock between a consumer group's receives and its deletion (docs/decisions/0088).

A receive that may write (its cursors, its deliveries) takes the group's row FOR KEY SHARE first
(`hold_for_receive`); the deletion takes it FOR UPDATE first (`lock_for_delete`). A receive under
way so ends before the deletion begins, and the deletion then removes what it wrote; a receive
that starts later waits for the deletion and finds no group: NotFound, which every door answers
as it answers a group that never existed (REST 404 `not_found`, gRPC CONSUMER_GROUP_NOT_FOUND).
Without it, rows a receive wrote beside a deletion met the foreign key at its commit (a 500), or
the two deadlocked. Receives of other groups, acks and changes of the group (UPDATEs of a
delivery, re-checked under its row lock) take nothing more.
"""

from django.db import connection

from apps.broker.models import ConsumerGroup
from apps.broker.services.errors import NotFound

# The receive's one statement before its writes: the group's lock and, on one Postgres, its
# commit without waiting for the WAL flush (docs/decisions/0025), so the lock costs no round trip.
_HOLD_SQL = "SELECT true FROM broker_consumergroup WHERE id = %s FOR KEY SHARE"
_HOLD_NO_FLUSH_SQL = (
    "SELECT set_config('synchronous_commit', 'off', true) FROM broker_consumergroup "
    "WHERE id = %s FOR KEY SHARE"
)
_LOCK_SQL = "SELECT id FROM broker_consumergroup WHERE name = %s FOR UPDATE"


def group_not_found(name: str) -> NotFound:
    """The refusal of a consumer group that does not exist, the selectors' own words."""
    return NotFound(f"Consumer group {name!r} does not exist.", consumer_group=name)


def hold_for_receive(*, group: ConsumerGroup, synchronous: bool) -> None:
    """Call first in a receive's transaction: the group stays until it commits; NotFound if it was
    deleted (this call waited for that deletion, or the caller read the group before it).
    `synchronous`: TXHUB_RECEIVE_SYNCHRONOUS_COMMIT (off: the commit skips its WAL flush)."""
    with connection.cursor() as cursor:
        cursor.execute(_HOLD_SQL if synchronous else _HOLD_NO_FLUSH_SQL, [group.pk])
        if cursor.fetchone() is None:
            raise group_not_found(group.name)


def lock_for_delete(*, name: str) -> int:
    """Call first in the deletion's transaction: the group's id, once no receive of it is under
    way; NotFound if there is no such group."""
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_SQL, [name])
        row = cursor.fetchone()
    if row is None:
        raise group_not_found(name)
    return int(row[0])
