"""Celery's Redis transport, made to survive Redis going away under a running worker.

Two places in kombu's Redis transport reach for a channel whose connection is already gone and
crash the worker for good when Redis disappears mid-task (tests/e2e/test_losing_the_broker.py and
the chaos case F8 caught both):

- on close, the channel puts the task's unacked message back into the queue through a connection
  that no longer exists (AttributeError: 'NoneType' object has no attribute 'hostname');
- when the task finishes, its late ack is sent through that closed channel (AttributeError:
  'NoneType' object has no attribute 'client'), which kombu's ack_log_error does not catch.

txhub needs neither: Postgres is the source of truth, every task is idempotent and the next scan
re-creates the work (CONTRACT section 5); a message of a channel that died with its Redis has
nothing left to ack. kombu still restores unacked messages after their visibility timeout.
"""

import logging
from typing import Any

from kombu.transport import redis, virtual

logger = logging.getLogger(__name__)


class QoS(redis.QoS):
    def ack(self, delivery_tag: Any) -> None:
        if self.channel.closed or self.channel.connection is None:
            self._forget(delivery_tag, "ack")
            return
        super().ack(delivery_tag)  # type: ignore[no-untyped-call]

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        if self.channel.closed or self.channel.connection is None:
            self._forget(delivery_tag, "reject")
            return
        super().reject(delivery_tag, requeue=requeue)  # type: ignore[no-untyped-call]

    def _forget(self, delivery_tag: Any, what: str) -> None:
        # Bookkeeping only (the in-memory delivered set): the Redis that held the message is gone.
        logger.warning("%s of %s dropped: its channel closed with the broker", what, delivery_tag)
        virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]


class Channel(redis.Channel):
    QoS = QoS
    do_restore = False


class Transport(redis.Transport):
    Channel = Channel


class SentinelChannel(redis.SentinelChannel):
    """The same channel, its Redis found through Sentinels (docs/decisions/0043)."""

    QoS = QoS
    do_restore = False


class SentinelTransport(redis.SentinelTransport):
    Channel = SentinelChannel
