"""Domain errors raised by services; the API maps each to the contract's error format."""

from typing import Any

import psycopg
from django.db import InterfaceError, connection
from psycopg_pool import PoolTimeout


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


class Unauthenticated(BrokerError):
    """The caller's token is unknown or revoked: found by work that began while it was live (a
    client id claimed by a call authenticated just before its token's revocation)."""

    code = "unauthenticated"
    status = 401


class QuotaExceeded(Forbidden):
    """The producer group keeps its storage quota's worth of messages or more
    (TXHUB_PRODUCER_GROUP_STORAGE_QUOTA, docs/decisions/0085): it may not store more until
    retention removes some; nothing was stored. Not worth a retry soon."""

    code = "quota_exceeded"


class NotFound(BrokerError):
    code = "not_found"
    status = 404


class Conflict(BrokerError):
    code = "conflict"
    status = 409


class Throttled(BrokerError):
    """Over a per-token bound (apps/broker/slots.py); nothing was done. Retry after
    `retry_after` seconds: REST answers it as Retry-After, gRPC as TOO_MANY_REQUESTS."""

    code = "throttled"
    status = 429

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message, retry_after=retry_after)
        self.retry_after = retry_after


class Unavailable(BrokerError):
    """Something txhub needs for this change is unreachable; nothing was changed."""

    code = "unavailable"
    status = 503


class CallbackRefused(BrokerError):
    """A check URL txhub will not call (scheme, or an address outside the allowed hosts)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, check_url=[message])


class LookupUnfinished(CallbackRefused):
    """A check URL's host name whose lookup did not finish within its deadline, or was not
    started because the process holds too many lookups left behind (docs/decisions/0083, 0087).
    At registration it is the check URL's 400; a call records `reason` as an unreachable check.
    `reason` completes "the host name was ..."."""

    def __init__(self, host: str, reason: str) -> None:
        super().__init__(f"The host {host!r} was {reason}.")
        self.reason = reason


class TransactionResolved(Conflict):
    """The opposite resolution, or an action on a transaction already resolved."""

    code = "transaction_resolved"

    def __init__(self, *, state: str, message: str = "") -> None:
        super().__init__(message or f"The transaction is already {state}.", state=state)
        self.state = state


# SQLSTATEs that say the server cannot be talked to, whatever the query: class 08 (connection
# exception), 57P01-57P03 (shut down, crashed, starting up: a failover) and 53300 (no connection
# slot). Not the other OperationalErrors (a statement timeout, a deadlock, libpq refusing a query
# it cannot send): those are about one query, and a client told to retry would retry it forever
# (docs/decisions/0070; every door asks this, decision 0078).
_UNREACHABLE_STATES = ("08", "57P01", "57P02", "57P03", "53300")


def database_unreachable(error: BaseException, *, connection_lost: bool = False) -> bool:
    """Whether `error` means the database could not be reached (no primary, Postgres down, no
    connection from the pool in time) rather than that one query failed. `connection_lost`:
    whether the connection the failed query ran on is closed or broken now, when the caller
    knows (an error of libpq's own, without a SQLSTATE, counts only then)."""
    if isinstance(error, InterfaceError | psycopg.InterfaceError):
        return True  # the connection was already closed
    driver = error.__cause__ if isinstance(error.__cause__, psycopg.Error) else error
    if isinstance(driver, PoolTimeout):
        return True
    if not isinstance(driver, psycopg.OperationalError):
        return False
    state = driver.sqlstate
    if state:
        return state.startswith(_UNREACHABLE_STATES)
    if driver.pgconn is not None and driver.pgconn.status == psycopg.pq.ConnStatus.BAD:
        return True  # connecting failed
    return connection_lost


def database_unreachable_here(error: BaseException) -> bool:
    """`database_unreachable`, asked in the thread whose query failed: only there is its
    connection known, closed or broken now or not. Every door asks this of a database error,
    where it catches it (docs/decisions/0078)."""
    raw = connection.connection
    lost = raw is None or raw.closed or raw.broken
    return database_unreachable(error, connection_lost=lost)
