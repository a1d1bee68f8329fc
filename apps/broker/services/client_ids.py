"""Message ids a producer chooses (a RocketMQ client's own ids) are scoped per producer group
(docs/decisions/0040).

txhub keeps one message id space (the REST API, the console and the consumers find a message by
its id), so a client-chosen id is stored as it is while no other producer group holds it. When
another group already holds it (by chance or by squatting), this group's message is stored under
an id derived from the group and the client's id with a keyed hash: deterministic, so a retry
finds what the first try stored; unpredictable without the server's key, so nobody can squat it
in turn. The producer is answered with the id its message was stored under, and nothing in any
answer says that another group used the id.

A recalled message keeps its id as every stored message does (docs/decisions/0075): one client
message id, one message, and the id's trace stays that message's.
"""

from django.db import connection
from django.utils.crypto import salted_hmac

from apps.broker.models import CommitLogEntry, DelayedMessage, HalfMessage, RecalledMessage
from apps.broker.services.errors import Conflict

_SALT = "txhub.client-message-id"


def stored_id_for(*, client_id: str, producer_group: str) -> str:
    """The id under which `producer_group`'s message with the client's id `client_id` is, or
    will be, stored: the client's id unless another producer group's message holds it."""
    holder = _holder(client_id)
    if holder is None or holder == producer_group:
        return client_id
    return scoped_id(client_id=client_id, producer_group=producer_group)


def held(msg_id: str) -> bool:
    """Whether any message (a half message, a delayed message, a commit-log entry or a recalled
    message) is stored under `msg_id`: one plain statement. A fresh id, a client's every first
    send, is stored as it is and has no earlier message, so the sends and prepares ask this
    first and skip the lookups below, seven ORM queries (docs/decisions/0052). Only a hint: what
    decides is the claim of the statement that stores the id (claim_sql)."""
    with connection.cursor() as cursor:
        # The tables that store a message under its id: one SQL function (decision 0074).
        cursor.execute("SELECT broker_msg_id_held(%s)", [msg_id])
        row = cursor.fetchone()
    return bool(row and row[0])


# Each table's msg_id is unique on its own, so nothing but a claim keeps two messages from taking
# one id in two tables (a delayed and an immediate send of one client id, or another group's
# prepare and send, at once: decision 0040's rules assume an id has one holder). A statement
# that stores client-chosen ids claims them first, in its own transaction: broker_msg_ids_claim
# takes an advisory lock per id, held to the end of the transaction, then checks the tables in
# a fresh snapshot and raises unique_violation (IntegrityError) when one holds an id. Lock: two
# stores of one id are serialised, so the second sees the first's row and fails as a duplicate
# insert would, and its caller answers or re-scopes as for one (sending.message_send).
#
# claim_sql gives a statement its {claim}, a CTE (with its comma) to place among its CTEs, and its
# {claimed}, the condition that makes it store nothing before the claim was granted: an InitPlan,
# evaluated once before the scan it gates, so before any row or queue lock the statement takes.
def claim_sql(ids_args: str | None) -> dict[str, str]:
    """The parts that claim the ids `ids_args` names (the function's arguments: one scalar
    parameter per id, or VARIADIC and an array); None: no claim (no parts)."""
    if ids_args is None:
        return {"claim": "", "claimed": "true"}
    return {
        "claim": f"claim AS MATERIALIZED (SELECT broker_msg_ids_claim({ids_args}) AS ok),\n",
        "claimed": "(SELECT ok FROM claim)",
    }


def ids_args(n: int) -> str:
    # Scalar parameters, each typed: a list would cost psycopg a type search per call.
    return ", ".join(["%s::varchar"] * n)


def claim_ids(msg_ids: list[str]) -> None:
    """Claims `msg_ids` for the caller's transaction (see claim_sql): IntegrityError when one is
    held. Call inside the transaction that stores them, before its first lock of a queue row."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT broker_msg_ids_claim({ids_args(len(msg_ids))})", msg_ids)


def refuse_recalled(*, msg_id: str, producer_group: str) -> None:
    """Conflict when a recalled message holds `msg_id`: its id stays taken (decision 0075), so
    the group's new send or prepare under it is refused, as one under the id of another of its
    messages is. Another group's recalled message under it (a race with `stored_id_for`) is a
    conflict that says nothing about it."""
    holder = RecalledMessage.objects.filter(msg_id=msg_id).values_list("producer_group", flat=True)
    name = holder.first()
    if name == producer_group:
        raise Conflict(f"Message id {msg_id} is in use by a recalled message.")
    if name is not None:
        raise Conflict(f"Message id {msg_id} is in use.")


def scoped_id(*, client_id: str, producer_group: str) -> str:
    """32 upper-case hex characters, the shape of txhub's own ids."""
    digest = salted_hmac(_SALT, f"{producer_group}\x00{client_id}", algorithm="sha256")
    return digest.hexdigest()[:32].upper()


def _holder(msg_id: str) -> str | None:
    """The producer group of the message stored under `msg_id` (a half message, a delayed
    message, a commit-log entry or a recalled message), or None. An id is unique across the four
    tables' uses."""
    half = HalfMessage.objects.filter(msg_id=msg_id).values_list("producer_group__name", flat=True)
    for model in (CommitLogEntry, DelayedMessage, RecalledMessage):
        found = model.objects.filter(msg_id=msg_id).values_list("producer_group", flat=True)
        name = found.first()
        if name is not None:
            return str(name)
    name = half.first()
    return None if name is None else str(name)
