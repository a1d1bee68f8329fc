"""The Python SDK (txhub_client) from the application's side."""

from typing import Any

from txhub_client import LocalTransactionState, Message


class Listener:
    """A transaction listener: the local transaction's outcome is `decide`'s; a check commits."""

    def __init__(self, decide: Any) -> None:
        self.decide = decide
        self.checked: list[str] = []

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return self.decide(message, arg)  # type: ignore[no-any-return]

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        self.checked.append(str(message.transaction_id))
        return LocalTransactionState.COMMIT_MESSAGE
