"""The audit record (docs/decisions/0039): each audited change made through the REST API records
who, what, the target, the address and the door, once, in the change's own transaction; a
refused or rolled-back change records nothing; no record holds a token or a secret."""

import ast
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from apps.broker.models import (
    AuditRecord,
    ConsumerGroup,
    Delivery,
    DeliveryState,
    ProducerGroup,
    Topic,
)
from apps.broker.services import consuming, registry
from apps.broker.services.sending import OutgoingMessage, message_send
from tests.support.redis_outage import shared_cache_unreachable
from tests.support.responses import assert_error

FROM = "203.0.113.7"  # TEST-NET-3: the address the API client claims to come from
ROOT = Path(__file__).resolve().parents[2]


def only_record() -> AuditRecord:
    records = list(AuditRecord.objects.all())
    assert len(records) == 1, [(r.action, r.target) for r in records]
    return records[0]


def assert_made_by_the_admin_token(record: AuditRecord) -> None:
    assert (record.actor, record.actor_kind) == ("admin-test", "token")
    assert (record.door, record.address) == ("rest", FROM)


@pytest.fixture
def names(setup_topic: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    created = setup_topic()
    AuditRecord.objects.all().delete()  # the fixture's own tokens were recorded as "system"
    return created


def test_creating_a_token_records_who_its_name_id_and_scopes(
    api: APIClient, names: dict[str, Any]
) -> None:
    body = {"name": "deploy", "scopes": ["produce:order-service", "admin"]}
    created = api.post("/api/v1/tokens", body, format="json", REMOTE_ADDR=FROM)
    assert created.status_code == 201
    record = only_record()
    assert_made_by_the_admin_token(record)
    assert (record.action, record.target) == ("token_create", "deploy")
    assert record.detail == {
        "token_id": created.json()["id"],
        "scopes": ["admin", "produce:order-service"],
    }


def test_revoking_a_token_records_it_once(api: APIClient, names: dict[str, Any]) -> None:
    token, _ = registry.token_create(name="doomed", scopes=["admin"])
    AuditRecord.objects.all().delete()
    for _ in range(2):  # the second revocation changes nothing
        assert api.delete(f"/api/v1/tokens/{token.pk}", REMOTE_ADDR=FROM).status_code == 204
    record = only_record()
    assert_made_by_the_admin_token(record)
    assert (record.action, record.target, record.detail) == (
        "token_revoke",
        "doomed",
        {"token_id": token.pk},
    )


def test_changing_a_check_url_records_the_old_and_the_new_url(
    api: APIClient, names: dict[str, Any]
) -> None:
    path = "/api/v1/producer-groups/order-service"
    new = {"check_url": "http://127.0.0.1:9/new"}
    assert api.patch(path, new, format="json", REMOTE_ADDR=FROM).status_code == 200
    assert api.patch(path, new, format="json", REMOTE_ADDR=FROM).status_code == 200  # same
    record = only_record()
    assert_made_by_the_admin_token(record)
    assert (record.action, record.target) == ("check_url_change", "order-service")
    assert record.detail == {"old": "http://127.0.0.1:9/check", "new": "http://127.0.0.1:9/new"}


def test_a_check_url_is_recorded_without_its_password_or_query(
    api: APIClient, names: dict[str, Any]
) -> None:
    url = "http://shop:hunter2@127.0.0.1:9/check?key=s3cret"
    path = "/api/v1/producer-groups/order-service"
    assert api.patch(path, {"check_url": url}, format="json").status_code == 200
    assert only_record().detail["new"] == "http://shop:***@127.0.0.1:9/check?***"


def test_rotating_a_secret_records_who_and_neither_secret(
    api: APIClient, names: dict[str, Any]
) -> None:
    path = "/api/v1/producer-groups/order-service/rotate-secret"
    assert api.post(path, REMOTE_ADDR=FROM).status_code == 200
    record = only_record()
    assert_made_by_the_admin_token(record)
    assert (record.action, record.target, record.detail) == (
        "secret_rotate",
        "order-service",
        {},
    )


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("producer", "/api/v1/producer-groups/order-service/topics"),
        ("consumer", "/api/v1/consumer-groups/billing/topics"),
    ],
)
def test_editing_topic_bindings_records_the_topics_before_and_after(
    api: APIClient, names: dict[str, Any], kind: str, path: str
) -> None:
    registry.topic_create(name="payments", queues=1)
    bind = {"topics": ["payments", "orders"]}
    assert api.put(path, bind, format="json", REMOTE_ADDR=FROM).status_code == 200
    assert api.put(path, bind, format="json", REMOTE_ADDR=FROM).status_code == 200  # same
    assert api.put(path, {"topics": []}, format="json", REMOTE_ADDR=FROM).status_code == 200
    records = list(AuditRecord.objects.order_by("id"))
    assert [r.action for r in records] == ["topic_bindings_change"] * 2
    for record in records:
        assert_made_by_the_admin_token(record)
        assert record.target == names[kind]
    assert [r.detail for r in records] == [
        {"group": kind, "old": [], "new": ["orders", "payments"]},
        {"group": kind, "old": ["orders", "payments"], "new": []},
    ]


def dead_letter(names: dict[str, Any]) -> str:
    topic = Topic.objects.get(name=names["topic"])
    message = OutgoingMessage(producer_group=names["producer"], body=b"m", body_is_binary=False)
    sent = message_send(topic=topic, message=message)
    group = ConsumerGroup.objects.get(name=names["consumer"])
    consuming.message_receive(group=group, topic=topic, max_messages=1, invisible_seconds=60)
    assert Delivery.objects.update(state=DeliveryState.DLQ) == 1
    return sent.msg_id


def test_resending_a_dead_letter_records_the_consumer_token_and_the_message(
    names: dict[str, Any], make_client: Callable[..., APIClient]
) -> None:
    msg_id = dead_letter(names)
    consumer = make_client("consume:billing", name="billing-worker")
    AuditRecord.objects.all().delete()
    path = f"/api/v1/consumer-groups/billing/dlq/{msg_id}/resend"
    assert consumer.post(path, REMOTE_ADDR=FROM).status_code == 200
    record = only_record()
    assert (record.actor, record.actor_kind, record.door, record.address) == (
        "billing-worker",
        "token",
        "rest",
        FROM,
    )
    assert (record.action, record.target, record.detail) == (
        "dlq_resend",
        "billing",
        {"msg_id": msg_id},
    )


def test_a_refused_change_records_nothing(
    api: APIClient, names: dict[str, Any], make_client: Callable[..., APIClient]
) -> None:
    msg_id = dead_letter(names)
    outsider = make_client("consume:other", name="outsider")
    AuditRecord.objects.all().delete()
    group = "/api/v1/producer-groups/order-service"
    assert_error(api.delete("/api/v1/tokens/999999"), 404, "not_found")
    assert_error(api.post("/api/v1/producer-groups/nobody/rotate-secret"), 404, "not_found")
    refused_url = {"check_url": "http://10.1.2.3/c"}
    assert_error(api.patch(group, refused_url, format="json"), 400, "invalid_request")
    bind = {"topics": ["orders", "no-such-topic"]}
    assert_error(api.put(f"{group}/topics", bind, format="json"), 404, "not_found")
    assert_error(api.post("/api/v1/consumer-groups/billing/dlq/ABC/resend"), 404, "not_found")
    resend = f"/api/v1/consumer-groups/billing/dlq/{msg_id}/resend"
    assert_error(outsider.post(resend), 403, "forbidden")
    token = {"name": "x", "scopes": ["admin"]}
    assert_error(outsider.post("/api/v1/tokens", token, format="json"), 403, "forbidden")
    assert not AuditRecord.objects.exists()


def test_a_change_rolled_back_takes_its_record_with_it(
    api: APIClient, names: dict[str, Any]
) -> None:
    token, _ = registry.token_create(name="kept", scopes=["admin"])
    AuditRecord.objects.all().delete()
    # Redis is away: the web processes cannot be told of the change, so it is rolled back (503).
    with shared_cache_unreachable():
        assert_error(api.delete(f"/api/v1/tokens/{token.pk}"), 503, "unavailable")
        bind = {"topics": ["orders"]}
        path = "/api/v1/consumer-groups/billing/topics"
        assert_error(api.put(path, bind, format="json"), 503, "unavailable")
    assert not AuditRecord.objects.exists()


def test_no_record_holds_a_token_or_a_secret(
    api: APIClient, names: dict[str, Any], make_client: Callable[..., APIClient]
) -> None:
    created = api.post("/api/v1/tokens", {"name": "t", "scopes": ["admin"]}, format="json").json()
    api.delete(f"/api/v1/tokens/{created['id']}")
    old_secret = ProducerGroup.objects.get(name="order-service").signing_secret
    rotated = api.post("/api/v1/producer-groups/order-service/rotate-secret").json()
    stored = ProducerGroup.objects.get(name="order-service")
    assert AuditRecord.objects.count() == 3
    everything = json.dumps(list(AuditRecord.objects.values()), default=str)
    for secret in (
        created["token"],
        created["token"][:10],  # the stored prefix
        registry.hash_token(created["token"]),
        created["secret_key"],
        old_secret,
        rotated["signing_secret"],
        stored.previous_signing_secret,
    ):
        assert secret not in everything


def test_the_create_token_command_records_the_cli(db: None) -> None:
    call_command("create_token", "from-a-shell", "--scope", "admin", "--json")
    record = only_record()
    assert (record.actor_kind, record.door, record.address) == ("cli", "cli", "cli")
    assert record.actor  # the operating system's user, when it can be told
    assert (record.action, record.target) == ("token_create", "from-a-shell")


def test_a_call_from_code_without_a_door_is_recorded_as_system(db: None) -> None:
    registry.token_create(name="seed", scopes=["admin"])
    record = only_record()
    assert (record.actor, record.actor_kind, record.door, record.address) == (
        "system",
        "system",
        "system",
        "",
    )


AUDITED = {
    "token_create",
    "token_revoke",
    "producer_group_update",
    "producer_group_rotate_secret",
    "producer_group_bind_topics",
    "consumer_group_bind_topics",
    "consumer_group_delete",
    "dlq_resend",
}


def test_every_door_names_who_calls_an_audited_service() -> None:
    """The services default to the "system" origin for code with no door (tests, benchmarks):
    every call from the application itself must name its caller instead."""
    calls, unnamed = 0, []
    for path in (ROOT / "apps").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            owner = node.func.value
            if not isinstance(owner, ast.Name) or owner.id not in {"registry", "dead_letters"}:
                continue
            if node.func.attr in AUDITED:
                calls += 1
                if "origin" not in {keyword.arg for keyword in node.keywords}:
                    unnamed.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert calls >= 18  # REST, console, admin and the CLI: the scan found them
    assert unnamed == []
