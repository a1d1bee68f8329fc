"""A deleted consumer group leaves no access behind (docs/decisions/0088): its `consume:<name>`
scope leaves every token in the deletion's transaction, audited, so a later group of the same name
(another tenant's) is not the old tokens'. Over REST, whose process keeps tokens under the
configuration epoch (decision 0026): the narrowing holds at the next call. A token left with no
scope stays a token; other scopes, and other groups' tokens, are untouched."""

from typing import Any

from rest_framework.test import APIClient

from apps.broker.models import ApiToken, AuditRecord, GrpcClient, Topic
from apps.broker.services import registry, sending
from apps.broker.services.sending import OutgoingMessage
from tests.conftest import client_for
from tests.support.responses import assert_error


def setup_orders() -> None:
    registry.topic_create(name="orders", queues=1)
    registry.producer_group_create(name="shop", check_url="http://127.0.0.1:9/")
    for name in ("billing", "audit-log"):
        registry.consumer_group_create(name=name, max_delivery_attempts=16, consume_from="first")


def send(n: int) -> None:
    sending.message_send_batch(
        topic=Topic.objects.get(name="orders"),
        messages=[
            (OutgoingMessage("shop", f"m{i}".encode(), body_is_binary=False), None)
            for i in range(n)
        ],
    )


def receive(client: APIClient, group: str) -> Any:
    body = {"topic": "orders", "max_messages": 1}
    return client.post(f"/api/v1/consumer-groups/{group}/receive", body, format="json")


def test_a_token_of_a_deleted_group_cannot_receive_from_a_new_group_of_its_name(
    api: APIClient, db: None
) -> None:
    setup_orders()
    send(2)
    old_tenant = client_for("consume:billing", name="old-tenant")
    both = client_for("consume:billing", "consume:audit-log", name="both")
    other = client_for("consume:audit-log", name="other-tenant")
    # Before: the old tenant's token receives (its process keeps it under the epoch from here).
    assert receive(old_tenant, "billing").json()["messages"]

    assert api.delete("/api/v1/consumer-groups/billing").status_code == 204
    made = {"name": "billing", "consume_from": "first"}
    assert api.post("/api/v1/consumer-groups", made, format="json").status_code == 201

    for client in (old_tenant, both):
        assert_error(receive(client, "billing"), 403, "forbidden")
    # Positive controls: another group's scope stays, on the narrowed token and on its own.
    assert receive(both, "audit-log").json()["messages"]
    assert receive(other, "audit-log").json()["messages"]
    # A token whose scope went stays a token, and a new one the operator makes for the new
    # group receives from it.
    assert ApiToken.objects.get(name="old-tenant").scopes == []
    assert ApiToken.objects.get(name="old-tenant").revoked_at is None
    assert ApiToken.objects.get(name="both").scopes == ["consume:audit-log"]
    assert ApiToken.objects.get(name="other-tenant").scopes == ["consume:audit-log"]
    new_tenant = client_for("consume:billing", name="new-tenant")
    assert receive(new_tenant, "billing").json()["messages"]


def test_the_deletion_records_which_tokens_lost_the_scope_and_forgets_its_grpc_consumers(
    db: None,
) -> None:
    setup_orders()
    narrowed, _ = registry.token_create(name="a", scopes=["consume:billing", "produce:shop"])
    revoked, _ = registry.token_create(name="b", scopes=["consume:billing"])
    registry.token_revoke(token_id=revoked.pk)
    kept, _ = registry.token_create(name="c", scopes=["consume:audit-log", "consume:billing-2"])
    for client_id, client_type, group in (
        ("billing-consumer", "SIMPLE_CONSUMER", "billing"),
        ("billing-producer", "PRODUCER", "billing"),  # a producer group of the same name
        ("audit-consumer", "PUSH_CONSUMER", "audit-log"),
    ):
        GrpcClient.objects.create(
            client_id=client_id, client_type=client_type, group=group, token=narrowed
        )

    registry.consumer_group_delete(name="billing")

    record = AuditRecord.objects.get(action="consumer_group_delete")
    assert record.detail["scope_removed_from_tokens"] == [narrowed.pk, revoked.pk]
    assert ApiToken.objects.get(pk=narrowed.pk).scopes == ["produce:shop"]
    assert ApiToken.objects.get(pk=revoked.pk).scopes == []
    assert ApiToken.objects.get(pk=kept.pk).scopes == ["consume:audit-log", "consume:billing-2"]
    assert set(GrpcClient.objects.values_list("client_id", flat=True)) == {
        "billing-producer",
        "audit-consumer",
    }
