"""A topic's or group's name is checked by the registry's write itself (limits.check_name,
docs/decisions/0106), and a token's name by token_create: whichever door calls them, a name the
rule refuses is a 400 about `name` and nothing is stored. The REST door and the create_token
command answer as before."""

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from apps.broker.models import (
    ApiToken,
    AuditRecord,
    ConsumerGroup,
    MessageQueue,
    ProducerGroup,
    Topic,
)
from apps.broker.services import registry
from apps.broker.services.errors import BrokerError
from tests.support.responses import assert_error

# Names no door accepts for a topic or a group: invisible and bidirectional characters (the
# console would show a name that reads as another), what Postgres cannot store, the reserved
# prefixes in any case, RocketMQ's own dead-letter and retry spellings, one character too many,
# nothing at all.
HOSTILE_NAMES = {
    "zero-width joiner": "pay\u200dments",
    "zero-width space": "pay\u200bments",
    "bidi override": "invoice\u202efdp",
    "NUL": "pay\x00ments",
    "lone surrogate": "pay\ud800ments",
    "reserved txhub_": "txhub_dlq",
    "reserved rmq_sys_ in upper case": "RMQ_SYS_retry",
    "dead-letter spelling": "%DLQ%orders",
    "retry spelling": "%RETRY%orders",
    "over-long": "x" * 128,
    "empty": "",
}
# A token's name is a label (any storable text): only these are refused.
HOSTILE_TOKEN_NAMES = {
    "NUL": "ops\x00",
    "lone surrogate": "ops\ud800",
    "over-long": "x" * 128,
    "empty": "",
}

CREATES: dict[str, Callable[[str], Any]] = {
    "topic": lambda name: registry.topic_create(name=name, queues=2),
    "producer group": lambda name: registry.producer_group_create(name=name),
    "consumer group": lambda name: registry.consumer_group_create(
        name=name, max_delivery_attempts=16, consume_from="first"
    ),
}


def nothing_stored() -> None:
    assert not Topic.objects.exists()
    assert not MessageQueue.objects.exists()
    assert not ProducerGroup.objects.exists()
    assert not ConsumerGroup.objects.exists()


@pytest.mark.parametrize("what", CREATES)
@pytest.mark.parametrize("name", HOSTILE_NAMES.values(), ids=HOSTILE_NAMES)
def test_the_registry_refuses_a_name_the_rule_refuses_and_stores_nothing(
    db: None, what: str, name: str
) -> None:
    with pytest.raises(BrokerError) as refused:
        CREATES[what](name)
    assert refused.value.status == 400
    assert list(refused.value.details) == ["name"]
    assert refused.value.details["name"] == [refused.value.message]
    nothing_stored()


@pytest.mark.parametrize("what", CREATES)
def test_the_registrys_refusal_says_what_the_rest_door_says(db: None, what: str) -> None:
    with pytest.raises(BrokerError) as refused:
        CREATES[what]("txhub_dlq")
    assert refused.value.message == "name must not start with a reserved prefix (rmq_sys_, txhub_)."


@pytest.mark.parametrize("name", HOSTILE_TOKEN_NAMES.values(), ids=HOSTILE_TOKEN_NAMES)
def test_token_create_refuses_a_name_it_cannot_keep_and_stores_nothing(db: None, name: str) -> None:
    with pytest.raises(BrokerError) as refused:
        registry.token_create(name=name, scopes=["admin"])
    assert refused.value.status == 400
    assert list(refused.value.details) == ["name"]
    assert not ApiToken.objects.exists()
    assert not AuditRecord.objects.exists()


REST_PATHS = {
    "topic": "/api/v1/topics",
    "producer group": "/api/v1/producer-groups",
    "consumer group": "/api/v1/consumer-groups",
}


@pytest.mark.parametrize("what", REST_PATHS)
@pytest.mark.parametrize("name", HOSTILE_NAMES.values(), ids=HOSTILE_NAMES)
def test_the_rest_door_refuses_a_hostile_name_about_its_name_field(
    api: APIClient, what: str, name: str
) -> None:
    # json.dumps escapes what is not ASCII, a lone surrogate too ("\ud800"), as a client may.
    body = json.dumps({"name": name})
    error = assert_error(
        api.post(REST_PATHS[what], body, content_type="application/json"), 400, "invalid_request"
    )
    assert list(error["details"]) == ["name"]
    nothing_stored()


@pytest.mark.parametrize("name", HOSTILE_TOKEN_NAMES.values(), ids=HOSTILE_TOKEN_NAMES)
def test_the_create_token_command_refuses_a_name_it_cannot_keep(db: None, name: str) -> None:
    with pytest.raises(CommandError, match="A token's name|NUL characters"):
        call_command("create_token", name, "--scope", "admin")
    assert not ApiToken.objects.exists()


def test_the_create_token_command_refuses_a_scope_as_before(db: None) -> None:
    with pytest.raises(CommandError) as refused:
        call_command("create_token", "ops", "--scope", "admin", "--scope", "produce:txhub_x!")
    assert str(refused.value) == (
        "A scope is 'admin', 'produce:<producer group>' or 'consume:<group>'."
    )
    assert not ApiToken.objects.exists()
