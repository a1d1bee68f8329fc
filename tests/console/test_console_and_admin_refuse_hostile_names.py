"""The console's and the admin's doors to the registry with names the rule refuses
(docs/decisions/0106): the console's forms answer about the field and store nothing; the admin
has no add form for a topic, a group or a token (its writes go through the services), so a
hostile name posted to one is refused whole and nothing is stored."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.broker.models import ApiToken, ConsumerGroup, MessageQueue, ProducerGroup, Topic
from tests.support.console import login

# As tests/broker/test_registry_refuses_names_the_rule_refuses.py's, less the lone surrogate,
# which a form post cannot carry (its encoding turns it into U+FFFD, refused like the others).
HOSTILE_NAMES = {
    "zero-width joiner": "pay\u200dments",
    "zero-width space": "pay\u200bments",
    "bidi override": "invoice\u202efdp",
    "NUL": "pay\x00ments",
    "reserved txhub_": "txhub_dlq",
    "reserved rmq_sys_ in upper case": "RMQ_SYS_retry",
    "dead-letter spelling": "%DLQ%orders",
    "retry spelling": "%RETRY%orders",
    "over-long": "x" * 128,
    "empty": "",
}

CONSOLE_FORMS = {
    "topic": ("/console/topics/new/", {"queues": "2"}),
    "producer group": ("/console/producer-groups/new/", {}),
    "consumer group": (
        "/console/consumer-groups/new/",
        {"max_delivery_attempts": "16", "consume_from": "first"},
    ),
}


def nothing_stored() -> None:
    assert not Topic.objects.exists()
    assert not MessageQueue.objects.exists()
    assert not ProducerGroup.objects.exists()
    assert not ConsumerGroup.objects.exists()
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize("what", CONSOLE_FORMS)
@pytest.mark.parametrize("name", HOSTILE_NAMES.values(), ids=HOSTILE_NAMES)
def test_a_console_form_refuses_a_hostile_name_on_its_name_field(
    db: None, what: str, name: str
) -> None:
    path, extra = CONSOLE_FORMS[what]
    page: Any = login("txhub-operators", "otto").post(path, {"name": name, **extra})
    assert page.status_code == 200
    assert list(page.context["form"].errors) == ["name"]
    nothing_stored()


ADMIN_MODELS = {
    "topic": {"queues": "2"},
    "producergroup": {"check_url": ""},
    "consumergroup": {"max_delivery_attempts": "16", "consume_from": "first"},
    "apitoken": {"scopes": '["admin"]'},
}


@pytest.mark.parametrize("model", ADMIN_MODELS)
@pytest.mark.parametrize("name", HOSTILE_NAMES.values(), ids=HOSTILE_NAMES)
def test_the_admin_has_no_add_form_a_hostile_name_could_pass(
    db: None, model: str, name: str
) -> None:
    admin = Client()
    admin.force_login(User.objects.create_superuser("root"))
    path = f"/admin/broker/{model}/add/"
    assert admin.get(path).status_code == 403
    assert admin.post(path, {"name": name, **ADMIN_MODELS[model]}).status_code == 403
    nothing_stored()
