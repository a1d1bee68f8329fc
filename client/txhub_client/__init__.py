"""txhub's Python SDK: feels like RocketMQ's TransactionMQProducer + TransactionListener."""

from txhub_client.barrier import Barrier, BarrierRolledBack
from txhub_client.checkback import (
    CheckbackApp,
    InvalidSignature,
    django_check_view,
    verify_signature,
)
from txhub_client.consumer import ReceivedMessage, SimpleConsumer
from txhub_client.http import TxhubError
from txhub_client.producer import (
    BatchOutcome,
    LocalTransactionState,
    Message,
    Producer,
    RecallResult,
    SendResult,
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
)

__all__ = [
    "Barrier",
    "BatchOutcome",
    "BarrierRolledBack",
    "CheckbackApp",
    "InvalidSignature",
    "LocalTransactionState",
    "Message",
    "Producer",
    "ReceivedMessage",
    "RecallResult",
    "SendResult",
    "SimpleConsumer",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "TxhubError",
    "django_check_view",
    "verify_signature",
]
