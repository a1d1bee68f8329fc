"""Who reads a check URL's credentials over REST (docs/decisions/0079): only the admin scope
reads a producer group, and it may change the URL, so it reads it whole; every other token is
refused before anything is shown; a read that cannot tell who may change the URL shows it masked
as the audit records it."""

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.broker.api import output
from apps.broker.models import AuditRecord, ProducerGroup
from tests.support.responses import assert_error, expect

SECRET_URL = "http://shop:hunter2@127.0.0.1:9/check?key=s3cret"
MASKED_URL = "http://shop:***@127.0.0.1:9/check?***"
GROUP = "/api/v1/producer-groups/shop"


@pytest.fixture
def shop(api: APIClient) -> None:
    created = {"name": "shop", "check_url": SECRET_URL}
    expect(api.post("/api/v1/producer-groups", created, format="json"), 201)


def test_the_admin_scope_reads_the_check_url_whole_at_every_answer(
    api: APIClient, shop: None
) -> None:
    answers = [
        api.get("/api/v1/producer-groups"),
        api.get(GROUP),
        api.patch(GROUP, {"check_url": SECRET_URL}, format="json"),
        api.put(f"{GROUP}/topics", {"topics": []}, format="json"),
        api.post(f"{GROUP}/rotate-secret"),
    ]
    bodies = [expect(answer, 200) for answer in answers]
    assert bodies[0][0]["check_url"] == SECRET_URL
    assert {body["check_url"] for body in bodies[1:]} == {SECRET_URL}


def test_patching_back_the_url_an_admin_read_keeps_the_credentials(
    api: APIClient, shop: None
) -> None:
    read = expect(api.get(GROUP), 200)["check_url"]
    expect(api.patch(GROUP, {"check_url": read}, format="json"), 200)
    assert ProducerGroup.objects.get(name="shop").check_url == SECRET_URL
    assert not AuditRecord.objects.filter(action="check_url_change").exists()


@pytest.mark.parametrize("scopes", [["produce:shop"], ["consume:billing"]])
def test_a_token_that_may_not_change_the_url_cannot_read_it(
    shop: None, make_client: Callable[..., APIClient], scopes: list[str]
) -> None:
    client = make_client(*scopes, name="reader")
    for answer in (client.get("/api/v1/producer-groups"), client.get(GROUP)):
        assert_error(answer, 403, "forbidden")
        assert "hunter2" not in answer.content.decode()


def test_a_read_that_does_not_say_who_may_change_the_url_shows_it_masked(
    shop: None,
) -> None:
    group = ProducerGroup.objects.get(name="shop")
    shown: Any = output.ProducerGroupOut(group).data
    assert shown["check_url"] == MASKED_URL
    refused = output.ProducerGroupOut(group, context={"may_change_check_url": False}).data
    assert refused["check_url"] == MASKED_URL
