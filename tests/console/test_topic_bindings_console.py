"""The console's group pages show and edit topic bindings: operators only, POST + CSRF, through
the registry service (the API's write path)."""

from typing import Any

import pytest
from django.test import Client

from apps.broker.models import ConsumerGroup, ProducerGroup
from apps.broker.services import registry
from tests.support.console import login

PRODUCER_PATH = "/console/producer-groups/shop/topics/"
CONSUMER_PATH = "/console/consumer-groups/billing/topics/"


@pytest.fixture
def groups(db: None) -> None:
    registry.topic_create(name="orders", queues=1)
    registry.topic_create(name="payments", queues=1)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/check")
    registry.consumer_group_create(name="billing", max_delivery_attempts=3, consume_from="first")


def bound() -> tuple[list[str], list[str]]:
    def names(group: ProducerGroup | ConsumerGroup) -> list[str]:
        return sorted(topic.name for topic in group.topics.all())

    return (
        names(ProducerGroup.objects.get(name="shop")),
        names(ConsumerGroup.objects.get(name="billing")),
    )


@pytest.mark.parametrize("path", [PRODUCER_PATH, CONSUMER_PATH])
def test_a_viewer_cannot_bind(groups: None, path: str) -> None:
    viewer = login("txhub-viewers", "vera")
    assert viewer.post(path, {"topics": "orders"}).status_code == 403
    assert viewer.get(path).status_code == 405  # writes are POST only
    assert bound() == ([], [])


@pytest.mark.parametrize("path", [PRODUCER_PATH, CONSUMER_PATH])
def test_binding_needs_the_csrf_token(groups: None, path: str) -> None:
    operator = login("txhub-operators", "otto")
    strict = Client(enforce_csrf_checks=True)
    strict.cookies = operator.cookies
    assert strict.post(path, {"topics": "orders"}).status_code == 403
    assert bound() == ([], [])


def test_an_operator_binds_and_unbinds_and_everyone_sees_it(groups: None) -> None:
    operator = login("txhub-operators", "otto")
    assert operator.post(PRODUCER_PATH, {"topics": "payments, orders"}).status_code == 302
    assert operator.post(CONSUMER_PATH, {"topics": "orders"}).status_code == 302
    assert bound() == (["orders", "payments"], ["orders"])
    viewer = login("txhub-viewers", "vera")
    producers = viewer.get("/console/producer-groups/").content.decode()
    assert "<code>orders</code> <code>payments</code>" in producers
    consumer = viewer.get("/console/consumer-groups/billing/").content.decode()
    assert "<code>orders</code>" in consumer
    assert "<code>orders</code>" in viewer.get("/console/consumer-groups/").content.decode()
    assert 'value="orders"' in operator.get("/console/consumer-groups/billing/").content.decode()
    assert operator.post(CONSUMER_PATH, {"topics": ""}).status_code == 302
    assert bound() == (["orders", "payments"], [])
    page = viewer.get("/console/consumer-groups/billing/").content.decode()
    assert "receives from any topic" in page


@pytest.mark.parametrize("path", [PRODUCER_PATH, CONSUMER_PATH])
@pytest.mark.parametrize("topics", ["orders nowhere", "orders bad\x00name", "orders txhub_x"])
def test_a_missing_or_bad_topic_is_shown_on_the_form_and_binds_nothing(
    groups: None, path: str, topics: str
) -> None:
    operator = login("txhub-operators", "otto")
    answer: Any = operator.post(path, {"topics": topics})
    assert answer.status_code == 200
    assert answer.context["form"].errors
    assert bound() == ([], [])
