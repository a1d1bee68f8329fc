"""Producers: `Producer.send` for normal and delayed messages, and `TransactionProducer` with a
`TransactionListener`, as in RocketMQ."""

import base64
import enum
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from txhub_client.http import DEFAULT_RETRY_BUDGET, Api, TxhubError

logger = logging.getLogger(__name__)


class LocalTransactionState(enum.Enum):
    """RocketMQ's names for what the local transaction became."""

    COMMIT_MESSAGE = "COMMIT"
    ROLLBACK_MESSAGE = "ROLLBACK"
    UNKNOW = "UNKNOWN"  # RocketMQ's spelling; check-back will ask later


@dataclass
class Message:
    topic: str
    body: str | bytes
    tags: str | None = None
    keys: list[str] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    delay_level: int | None = None  # 1..18: 1s 5s 10s 30s 1m ... 2h
    deliver_at: datetime | None = None  # timezone-aware
    # Messages of one group are received in order by a FIFO consumer group; never delayed.
    message_group: str | None = None
    # Sent as Idempotency-Key. Unset, each send makes a random one that only its own retries reuse
    # (never written here): sending this object again stores it again. Set your own (e.g.
    # "order-9527-created") to store it once across sends and process restarts: a repeat gets
    # the first answer, a changed one 409 (docs/decisions/0082).
    idempotency_key: str | None = None
    # Filled in by txhub:
    msg_id: str | None = None
    transaction_id: str | None = None

    def payload(self, producer_group: str) -> dict[str, Any]:
        data: dict[str, Any] = {"producer_group": producer_group}
        if isinstance(self.body, bytes):
            data["body_base64"] = base64.b64encode(self.body).decode()
        else:
            data["body"] = self.body
        if self.tags is not None:
            data["tags"] = self.tags
        if self.keys:
            data["keys"] = self.keys
        if self.properties:
            data["properties"] = self.properties
        if self.delay_level is not None:
            data["delay_level"] = self.delay_level
        if self.deliver_at is not None:
            data["deliver_at"] = self.deliver_at.isoformat()
        if self.message_group is not None:
            data["message_group"] = self.message_group
        return data


@dataclass(frozen=True)
class SendResult:
    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int | None
    deliver_at: str | None
    status: str = "SEND_OK"
    message_group: str | None = None


@dataclass(frozen=True)
class RecallResult:
    """A delayed message recalled (now or earlier): it is never delivered."""

    msg_id: str
    topic: str
    deliver_at: str  # when it would have been delivered
    recalled_at: str
    recalled_by: str  # the token's name
    door: str  # "rest" or "grpc"


@dataclass(frozen=True)
class TransactionSendResult:
    msg_id: str
    transaction_id: str
    local_transaction_state: LocalTransactionState
    state: str  # txhub's: PREPARED (left to check-back), COMMITTED or ROLLED_BACK
    queue_offset: int | None = None
    error: BaseException | None = None  # what went wrong locally or on the end call, if anything

    @property
    def diverged(self) -> bool:
        """The local transaction and the message ended differently: txhub had resolved the
        transaction the other way (check-back, an operator) before the end call arrived, which
        was refused 409 `transaction_resolved` (in `error`). Reconcile the local side."""
        opposite = {
            LocalTransactionState.COMMIT_MESSAGE: "ROLLED_BACK",
            LocalTransactionState.ROLLBACK_MESSAGE: "COMMITTED",
        }
        return opposite.get(self.local_transaction_state) == self.state


class TransactionListener(Protocol):
    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState: ...

    def check_local_transaction(self, message: Message) -> LocalTransactionState: ...


class Producer:
    """Normal and delayed messages."""

    def __init__(
        self,
        url: str,
        token: str,
        group: str,
        *,
        timeout: float = 30,
        retries: int | None = None,
        retry_budget: float = DEFAULT_RETRY_BUDGET,
    ) -> None:
        """`timeout` bounds each request; keyed and repeatable calls are retried on connection
        errors, timeouts, 429 and 503 for up to `retry_budget` seconds in all, at most `retries`
        times (None: as often as the budget allows; 0: never). See Api.call."""
        self.api = Api(url, token, timeout=timeout, retry_budget=retry_budget)
        self.group = group
        self.retries = retries

    @staticmethod
    def _key(message: Message) -> str:
        """The caller's key, or a new one for this call alone: a key written back onto the
        message would make its next send a replay of this one (docs/decisions/0082)."""
        return message.idempotency_key or uuid.uuid4().hex

    def send(self, message: Message) -> SendResult:
        answer = self.api.call(
            "POST",
            f"/topics/{message.topic}/messages",
            message.payload(self.group),
            idempotency_key=self._key(message),
            retries=self.retries,
        )
        message.msg_id = answer["msg_id"]
        return SendResult(
            answer["msg_id"],
            answer["topic"],
            answer["queue_id"],
            answer["queue_offset"],
            answer.get("deliver_at"),
            message_group=answer.get("message_group"),
        )

    def recall(self, msg_id: str) -> RecallResult:
        """Recalls a delayed message not yet delivered: it never will be. Raises TxhubError 409
        once it was delivered, 404 for an unknown or another group's message. A repeat answers
        the first recall, so it is retried like a commit."""
        answer = self.api.call(
            "POST", f"/messages/{msg_id}/recall", retries=self.retries, repeatable=True
        )
        return RecallResult(
            answer["msg_id"],
            answer["topic"],
            answer["deliver_at"],
            answer["recalled_at"],
            answer["recalled_by"],
            answer["door"],
        )

    def send_batch(
        self, messages: list[Message], *, idempotency_key: str | None = None
    ) -> list[SendResult]:
        """Up to 64 messages of one topic (4 MiB of bodies in all) in one request: all stored or
        none, results in the same order. Retried with one key like `send`."""
        topic = _one_topic(messages)
        answer = self.api.call(
            "POST",
            f"/topics/{topic}/messages:batch",
            {"producer_group": self.group, "messages": [_item(m, self.group) for m in messages]},
            idempotency_key=idempotency_key or uuid.uuid4().hex,
            retries=self.retries,
        )
        results = []
        for message, sent in zip(messages, answer["results"], strict=True):
            message.msg_id = sent["msg_id"]
            results.append(
                SendResult(
                    sent["msg_id"],
                    sent["topic"],
                    sent["queue_id"],
                    sent["queue_offset"],
                    sent.get("deliver_at"),
                    message_group=sent.get("message_group"),
                )
            )
        return results


@dataclass(frozen=True)
class BatchOutcome:
    """One transaction of a batch commit or rollback: its state, or the error it got alone."""

    transaction_id: str
    status: int
    state: str | None  # COMMITTED / ROLLED_BACK when status is 200
    queue_offset: int | None = None
    error: TxhubError | None = None


def _one_topic(messages: list[Message]) -> str:
    topics = {m.topic for m in messages}
    if len(topics) != 1:
        raise ValueError("A batch goes to one topic.")
    return topics.pop()


def _resolved_elsewhere(error: TxhubError) -> str | None:
    """The state a 409 `transaction_resolved` says the transaction already has (resolved the
    other way before the end call came), else None."""
    state = error.details.get("state") if error.code == "transaction_resolved" else None
    return state if error.status == 409 and isinstance(state, str) else None


def _item(message: Message, group: str) -> dict[str, Any]:
    data = message.payload(group)
    del data["producer_group"]  # named once by the batch
    return data


class TransactionProducer(Producer):
    """RocketMQ's TransactionMQProducer: prepare, run the local transaction, end it."""

    def __init__(
        self,
        url: str,
        token: str,
        group: str,
        listener: TransactionListener,
        *,
        timeout: float = 30,
        retries: int | None = None,
        retry_budget: float = DEFAULT_RETRY_BUDGET,
        check_immunity_seconds: int | None = None,
    ) -> None:
        super().__init__(
            url, token, group, timeout=timeout, retries=retries, retry_budget=retry_budget
        )
        self.listener = listener
        self.check_immunity_seconds = check_immunity_seconds

    def send_message_in_transaction(
        self, message: Message, arg: Any = None
    ) -> TransactionSendResult:
        payload = {**message.payload(self.group), "topic": message.topic}
        if self.check_immunity_seconds is not None:
            payload["check_immunity_seconds"] = self.check_immunity_seconds
        # Raises: nothing to undo. Retried with one key: a retry never prepares a second half.
        prepared = self.api.call(
            "POST",
            "/transactions",
            payload,
            idempotency_key=self._key(message),
            retries=self.retries,
        )
        message.msg_id = prepared["msg_id"]
        message.transaction_id = prepared["transaction_id"]
        error: BaseException | None = None
        try:
            local = self.listener.execute_local_transaction(message, arg)
        except Exception as exc:  # noqa: BLE001 - as RocketMQ: an exception is UNKNOW
            logger.exception(
                "local transaction %s failed; check-back will ask", message.transaction_id
            )
            local, error = LocalTransactionState.UNKNOW, exc
        state, offset = "PREPARED", None
        if local is not LocalTransactionState.UNKNOW:
            action = "commit" if local is LocalTransactionState.COMMIT_MESSAGE else "rollback"
            try:
                # A repeated commit (or rollback) answers the first one: safe to retry.
                ended = self.api.call(
                    "POST",
                    f"/transactions/{message.transaction_id}/{action}",
                    retries=self.retries,
                    repeatable=True,
                )
                state, offset = ended["state"], ended.get("queue_offset")
            except TxhubError as exc:
                error = exc
                state = _resolved_elsewhere(exc) or state
                if state == "PREPARED":  # the end call is lost: check-back settles it
                    logger.warning("ending transaction %s failed: %s", message.transaction_id, exc)
                else:
                    logger.error(
                        "transaction %s was already %s: the local transaction ended %s",
                        message.transaction_id,
                        state,
                        local.value,
                    )
            except OSError as exc:  # requests' errors: the end call is lost, as above
                logger.warning("ending transaction %s failed: %s", message.transaction_id, exc)
                error = exc
        return TransactionSendResult(
            prepared["msg_id"], prepared["transaction_id"], local, state, offset, error
        )

    def prepare_batch(
        self, messages: list[Message], *, idempotency_key: str | None = None
    ) -> list[Message]:
        """Half messages for up to 64 messages of one topic, stored together or not at all;
        fills in each message's msg_id and transaction_id. End them with `end_batch` (or one by
        one); what is never ended is settled by check-back, as for a single prepare."""
        topic = _one_topic(messages)
        items = [_item(m, self.group) for m in messages]
        if self.check_immunity_seconds is not None:
            for item in items:
                item["check_immunity_seconds"] = self.check_immunity_seconds
        answer = self.api.call(
            "POST",
            "/transactions:batch",
            {"producer_group": self.group, "topic": topic, "messages": items},
            idempotency_key=idempotency_key or uuid.uuid4().hex,
            retries=self.retries,
        )
        for message, prepared in zip(messages, answer["results"], strict=True):
            message.msg_id = prepared["msg_id"]
            message.transaction_id = prepared["transaction_id"]
        return messages

    def end_batch(self, transaction_ids: list[str], *, commit: bool) -> list[BatchOutcome]:
        """Commits (or rolls back) up to 64 transactions in one request; each is resolved on its
        own (one already rolled back answers 409 in its slot, the others are still committed).
        A repeat answers the first resolutions, so it is retried like a single end call."""
        answer = self.api.call(
            "POST",
            f"/transactions:{'commit' if commit else 'rollback'}",
            {"transaction_ids": transaction_ids},
            retries=self.retries,
            repeatable=True,
        )
        outcomes = []
        for slot in answer["results"]:
            if slot["status"] == 200:
                result = slot["result"]
                outcomes.append(
                    BatchOutcome(
                        slot["transaction_id"], 200, result["state"], result.get("queue_offset")
                    )
                )
            else:
                error = slot["error"]
                failure = TxhubError(
                    slot["status"], error["code"], error["message"], error["details"]
                )
                outcomes.append(
                    BatchOutcome(slot["transaction_id"], slot["status"], None, None, failure)
                )
        return outcomes
