"""Domain errors raised by services; the API maps each to the contract's error format."""

from typing import Any


class BrokerError(Exception):
    code = "invalid_request"
    status = 400

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


def invalid(field: str, message: str) -> BrokerError:
    """A 400 about one input field, with details shaped like the serializers' ({field: [msg]})."""
    return BrokerError(message, **{field: [message]})


class Forbidden(BrokerError):
    """Allowed by the token's scopes but not by the group's configuration (topic bindings)."""

    code = "forbidden"
    status = 403


class NotFound(BrokerError):
    code = "not_found"
    status = 404


class Conflict(BrokerError):
    code = "conflict"
    status = 409


class Unavailable(BrokerError):
    """Something txhub needs for this change is unreachable; nothing was changed."""

    code = "unavailable"
    status = 503


class CallbackRefused(BrokerError):
    """A check URL txhub will not call (scheme, or an address outside the allowed hosts)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, check_url=[message])


class TransactionResolved(Conflict):
    """The opposite resolution, or an action on a transaction already resolved."""

    code = "transaction_resolved"

    def __init__(self, *, state: str, message: str = "") -> None:
        super().__init__(message or f"The transaction is already {state}.", state=state)
        self.state = state
