"""Operator actions (console and Django admin): the same services as the API, with the operator's
user name and a required reason recorded in the op record, in the same database transaction."""

import uuid
from dataclasses import dataclass

from apps.broker import limits
from apps.broker.models import Resolver
from apps.broker.services import transactions
from apps.broker.services.errors import BrokerError, invalid
from apps.broker.services.transactions import Actor

ACTIONS = ("commit", "rollback", "resume")


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    message: str  # a sentence for the operator, also when nothing was done


def operator_act(
    *, transaction_id: uuid.UUID, action: str, username: str, reason: str
) -> ActionResult:
    if action not in ACTIONS:
        raise invalid("action", f"Unknown action {action!r}.")
    if not reason.strip():
        raise invalid("reason", "A reason is required.")
    actor = Actor(Resolver.OPERATOR, username)
    try:
        if action == "resume":
            transactions.transaction_resume(
                transaction_id=transaction_id, actor=actor, reason=reason
            )
            return ActionResult(True, "Resumed: check-back will ask the producer again.")
        resolve = RESOLVERS[action]
        outcome = resolve(transaction_id=transaction_id, actor=actor, reason=reason)
    except BrokerError as error:  # one transaction's outcome (gone, resolved meanwhile): said
        return ActionResult(False, f"Nothing done: {error.message}")
    state = outcome.half.state
    if not outcome.changed:
        return ActionResult(False, f"Nothing done: the transaction was already {state}.")
    return ActionResult(True, f"{state.replace('_', ' ').capitalize()} by {username}.")


def operator_act_many(
    *, transaction_ids: list[uuid.UUID], action: str, username: str, reason: str
) -> list[ActionResult]:
    """The console's and the admin's bulk action: the batch checked as a whole first, as REST's
    :commit and :rollback check theirs; then each transaction decided on its own (its own row
    lock and database transaction), so one resolved or gone meanwhile is reported and the rest
    still go ahead."""
    try:
        limits.check_id_batch(transaction_ids)
    except limits.LimitError as error:
        raise invalid("ids", str(error)) from None
    return [
        operator_act(transaction_id=transaction_id, action=action, username=username, reason=reason)
        for transaction_id in transaction_ids
    ]


RESOLVERS = {
    "commit": transactions.transaction_commit,
    "rollback": transactions.transaction_rollback,
}
