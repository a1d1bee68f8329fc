import pytest

from apps.broker.models import HalfMessage
from apps.broker.services import registry, transactions
from apps.broker.services.sending import OutgoingMessage
from tests.support.transactions import PRODUCER


@pytest.fixture
def half(db: None) -> HalfMessage:
    """A prepared transaction of the group "shop" on "orders", its body a script tag."""
    topic = registry.topic_create(name="orders", queues=1)
    group = registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    message = OutgoingMessage(
        producer_group="shop",
        body=b"<script>alert(1)</script>",
        body_is_binary=False,
        keys=["9527"],
    )
    return transactions.transaction_prepare(
        producer_group=group, topic=topic, message=message, actor=PRODUCER
    )
