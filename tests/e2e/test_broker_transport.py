# mypy: allow-untyped-calls
"""txhub's Celery transport against a real Redis: a late ack through a channel that closed with
its broker is dropped with a warning instead of killing the worker (chaos case F8 found the
crash: kombu's Redis QoS reached for the closed channel's connection)."""

import logging

import pytest
from kombu.connection import Connection
from kombu.entity import Exchange, Queue

from tests.support import workers

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("settle", ["ack", "reject"])
def test_settling_a_message_of_a_closed_channel_is_dropped_not_fatal(
    settle: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = workers.redis_url("spare")
    queue = Queue("transport-test", Exchange("transport-test"), routing_key="transport-test")
    with Connection(url, transport="txhub.broker_transport:Transport") as connection:
        channel = connection.channel()
        bound = queue(channel)
        bound.declare()
        bound.purge()
        connection.Producer(channel).publish(
            {"n": 1}, exchange=queue.exchange, routing_key="transport-test", declare=[queue]
        )
        message = bound.get(no_ack=False)
        assert message is not None
        assert message.payload == {"n": 1}
        channel.close()  # what kombu does when Redis goes away under the worker
        assert channel.connection is None
        with caplog.at_level(logging.WARNING, logger="txhub.broker_transport"):
            getattr(message, settle)()
        assert f"{settle} of {message.delivery_tag} dropped" in caplog.text


def test_settling_on_an_open_channel_still_reaches_redis() -> None:
    url = workers.redis_url("spare")
    queue = Queue(
        "transport-test-open", Exchange("transport-test-open"), routing_key="transport-test-open"
    )
    with Connection(url, transport="txhub.broker_transport:Transport") as connection:
        channel = connection.channel()
        bound = queue(channel)
        bound.declare()
        bound.purge()
        connection.Producer(channel).publish(
            {"n": 2}, exchange=queue.exchange, routing_key="transport-test-open", declare=[queue]
        )
        message = bound.get(no_ack=False)
        assert message is not None
        client = channel.client
        assert client.hexists(channel.unacked_key, message.delivery_tag)
        message.ack()
        assert not client.hexists(channel.unacked_key, message.delivery_tag)
        channel.close()
