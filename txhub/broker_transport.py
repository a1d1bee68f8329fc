"""Celery's Redis transport, without restoring unacked messages when a channel closes.

When Redis goes away while a task runs, kombu's Redis channel tries, on close, to put the task's
unacked message back into the queue through a connection that no longer exists, raises
AttributeError ('NoneType' object has no attribute 'hostname') and the worker exits for good
(tests/e2e/test_losing_the_broker.py caught it). txhub needs no restore: Postgres is the source of
truth, every task is idempotent and the next scan re-creates the work (CONTRACT section 5), and
kombu still restores unacked messages after their visibility timeout.
"""

from kombu.transport import redis


class Channel(redis.Channel):
    do_restore = False


class Transport(redis.Transport):
    Channel = Channel
