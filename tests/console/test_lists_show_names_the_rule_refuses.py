"""A topic or group whose name the rule refuses (limits.check_name) may be in the database: a row
from before the rule, or a direct write (docs/decisions/0106). The console's lists and the admin
still render it, its name shown with its invisible characters named, without the links and forms
that would need the name in a URL; the other rows keep theirs (docs/decisions/0114). The rows
are written with the ORM here on purpose: no door of txhub makes them."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from apps.broker.models import ConsumerGroup, ProducerGroup, Topic
from apps.broker.services import registry
from tests.support.console import login

# Each refused for another reason: a zero-width joiner, a reserved prefix (the URL converter's
# pattern alone would take it), a space, RocketMQ's dead-letter spelling.
REFUSED_NAMES = {
    "pay\u200dments": "pay[U+200D]ments",
    "txhub_dlq": "txhub_dlq",
    " billing": " billing",
    "%DLQ%orders": "%DLQ%orders",
}


@pytest.fixture
def rows(db: None) -> dict[str, Any]:
    registry.topic_create(name="orders", queues=1)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/check")
    registry.consumer_group_create(name="audit", max_delivery_attempts=3, consume_from="first")
    for name in REFUSED_NAMES:
        Topic.objects.create(name=name, queues=1)
        ProducerGroup.objects.create(name=name, signing_secret="s" * 32)
        ConsumerGroup.objects.create(name=name)
    return {"shop": "shop", "audit": "audit"}


def page_of(client: Client, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    return response.content.decode()


@pytest.mark.parametrize("role", ["txhub-operators", "txhub-viewers"])
def test_the_group_lists_render_a_group_no_url_can_name(rows: dict[str, Any], role: str) -> None:
    client = login(role, "otto")
    producers = page_of(client, reverse("console:producer-groups"))
    consumers = page_of(client, reverse("console:consumer-groups"))
    for shown in REFUSED_NAMES.values():
        assert shown in producers, shown
        assert shown in consumers, shown
    # No link or form names a refused group; the others keep theirs.
    for name in REFUSED_NAMES:
        assert f"/console/consumer-groups/{name}/" not in consumers, name
        assert f"/console/producer-groups/{name}/" not in producers, name
    assert reverse("console:consumer-group", args=["audit"]) in consumers
    if role == "txhub-operators":
        assert reverse("console:producer-group-edit", args=["shop"]) in producers
        assert reverse("console:producer-group-rotate", args=["shop"]) in producers
    assert producers.count("its name breaks the naming rule") == len(REFUSED_NAMES)
    assert consumers.count("its name breaks the naming rule") == len(REFUSED_NAMES)


def test_the_topics_page_names_the_invisible_characters_of_a_refused_name(
    rows: dict[str, Any],
) -> None:
    topics = page_of(login("txhub-viewers", "vera"), reverse("console:topics"))
    assert "pay[U+200D]ments" in topics
    assert "pay\u200dments" not in topics


@pytest.mark.parametrize("model", ["topic", "producergroup", "consumergroup"])
def test_the_admin_lists_and_shows_a_row_no_url_can_name(rows: dict[str, Any], model: str) -> None:
    admin = Client()
    admin.force_login(User.objects.create_superuser("root"))
    listed = page_of(admin, f"/admin/broker/{model}/")
    assert "pay[U+200D]ments" in listed
    rows_of = {"topic": Topic, "producergroup": ProducerGroup, "consumergroup": ConsumerGroup}
    for pk in rows_of[model]._default_manager.values_list("pk", flat=True):
        page_of(admin, f"/admin/broker/{model}/{pk}/change/")
