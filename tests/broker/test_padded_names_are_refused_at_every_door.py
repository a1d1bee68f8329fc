"""A name with whitespace at either end, or blank, is refused, never trimmed: a token's name by
limits.check_token_name, a topic's or a group's by limits.check_name, and every door answers
alike about the field `name` and stores nothing (docs/decisions/0114). REST answers with the
contract's JSON 400, the console's form with an error on its `name` field, the create_token
command with its error; the admin has no add form (its refusal is held by
tests/console/test_console_and_admin_refuse_hostile_names.py)."""

from typing import Any

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from apps.broker.models import ApiToken, AuditRecord, ConsumerGroup, ProducerGroup, Topic
from apps.broker.services import registry
from apps.broker.services.errors import BrokerError
from tests.support.console import login
from tests.support.responses import assert_error

PADDED_NAMES = {
    "three spaces": "   ",
    "a tab": "\t",
    "leading space": " ops",
    "trailing space": "ops ",
    "trailing newline": "ops\n",
    "leading ideographic space": "\u3000ops",
    "trailing no-break space": "ops\xa0",
}
TOKEN_REFUSAL = "A token's name must not be blank or begin or end with whitespace."


def tokens_other_than(kept: set[int]) -> list[str]:
    return list(ApiToken.objects.exclude(pk__in=kept).values_list("name", flat=True))


@pytest.mark.parametrize("name", PADDED_NAMES.values(), ids=PADDED_NAMES)
def test_token_create_refuses_a_padded_name_and_stores_nothing(db: None, name: str) -> None:
    with pytest.raises(BrokerError) as refused:
        registry.token_create(name=name, scopes=["admin"])
    assert refused.value.status == 400
    assert refused.value.details == {"name": [TOKEN_REFUSAL]}
    assert not ApiToken.objects.exists()
    assert not AuditRecord.objects.exists()


@pytest.mark.parametrize("name", PADDED_NAMES.values(), ids=PADDED_NAMES)
def test_the_rest_door_refuses_a_padded_token_name_with_the_contracts_400(
    api: APIClient, name: str
) -> None:
    kept = set(ApiToken.objects.values_list("pk", flat=True))  # the fixture's admin token
    response = api.post("/api/v1/tokens", {"name": name, "scopes": ["admin"]}, format="json")
    error = assert_error(response, 400, "invalid_request")
    assert error["details"] == {"name": [TOKEN_REFUSAL]}
    assert tokens_other_than(kept) == []


@pytest.mark.parametrize("name", PADDED_NAMES.values(), ids=PADDED_NAMES)
def test_the_console_refuses_a_padded_token_name_on_its_field(db: None, name: str) -> None:
    page: Any = login("txhub-operators", "otto").post(
        "/console/tokens/new/", {"name": name, "scopes": "admin"}
    )
    assert page.status_code == 200
    assert list(page.context["form"].errors) == ["name"]
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize("name", PADDED_NAMES.values(), ids=PADDED_NAMES)
def test_the_create_token_command_refuses_a_padded_name(db: None, name: str) -> None:
    with pytest.raises(CommandError, match=TOKEN_REFUSAL):
        call_command("create_token", name, "--scope", "admin")
    assert not ApiToken.objects.exists()


CONSOLE_FORMS = {
    "topic": ("/console/topics/new/", {"queues": "2"}, Topic),
    "producer group": ("/console/producer-groups/new/", {}, ProducerGroup),
    "consumer group": (
        "/console/consumer-groups/new/",
        {"max_delivery_attempts": "16", "consume_from": "first"},
        ConsumerGroup,
    ),
}


@pytest.mark.parametrize("what", CONSOLE_FORMS)
@pytest.mark.parametrize("name", PADDED_NAMES.values(), ids=PADDED_NAMES)
def test_the_console_refuses_a_padded_topic_or_group_name_as_rest_does(
    api: APIClient, what: str, name: str
) -> None:
    path, extra, model = CONSOLE_FORMS[what]
    page: Any = login("txhub-operators", "otto").post(path, {"name": name, **extra})
    assert page.status_code == 200
    assert list(page.context["form"].errors) == ["name"]
    rest_path = {"topic": "/api/v1/topics"}.get(what, "/api/v1/" + what.replace(" ", "-") + "s")
    response = api.post(rest_path, {"name": name}, format="json")
    assert list(assert_error(response, 400, "invalid_request")["details"]) == ["name"]
    assert not model._default_manager.exists()


def test_a_name_with_inner_spaces_is_a_label_every_door_keeps_as_given(api: APIClient) -> None:
    """The positive control: only the ends are refused."""
    kept = set(ApiToken.objects.values_list("pk", flat=True))
    registry.token_create(name="ops deploy", scopes=["admin"])
    assert (
        api.post(
            "/api/v1/tokens", {"name": "ops  rest", "scopes": ["admin"]}, format="json"
        ).status_code
        == 201
    )
    console = login("txhub-operators", "otto")
    assert console.post("/console/tokens/new/", {"name": "ops console", "scopes": "admin"})[
        "Location"
    ].endswith("/console/tokens/")
    call_command("create_token", "ops\tshell", "--scope", "admin")
    stored = {"ops  rest", "ops console", "ops deploy", "ops\tshell"}
    assert set(tokens_other_than(kept)) == stored
