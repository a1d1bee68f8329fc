"""The rules of an in-flight delivery no other test held to (found by the mutation review of
decision 0093). A receipt handle acts only while its receive is the delivery's latest and the
delivery is in flight (services/handles.py): a handle of an earlier receive changes nothing, a
handle whose message was dead-lettered or acked acks nothing, and a change of invisible time
racing an ack waits for it under the row's lock and is refused. A last attempt is dead-lettered
only once its invisible time is over, and only a dead-lettered message is sent back from the
dead-letter queue (services/dead_letters.py)."""

import threading
from typing import Any

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from apps.broker.models import ConsumerGroup, Delivery
from apps.broker.services import consuming, dead_letters
from apps.broker.services.errors import BrokerError, NotFound
from tests.support.own_connection import in_thread


def send(api: APIClient) -> None:
    payload = {"producer_group": "order-service", "body": "m"}
    assert api.post("/api/v1/topics/orders/messages", payload, format="json").status_code == 201


def receive(api: APIClient) -> list[dict[str, Any]]:
    payload = {"topic": "orders", "invisible_seconds": 10}
    response = api.post("/api/v1/consumer-groups/billing/receive", payload, format="json")
    assert response.status_code == 200, response.json()
    return list(response.json()["messages"])


def ack(api: APIClient, handle: str) -> dict[str, Any]:
    response = api.post(
        "/api/v1/consumer-groups/billing/ack", {"receipt_handles": [handle]}, format="json"
    )
    assert response.status_code == 200
    return dict(response.json())


def delivery_of(handle: str) -> Delivery:
    return Delivery.objects.get(pk=int(handle.split(".")[0]))


def test_a_handle_of_an_earlier_receive_changes_nothing(api: APIClient, setup_topic: Any) -> None:
    setup_topic()
    send(api)
    [first] = receive(api)
    with connection.cursor() as cursor:  # its invisible time passes, as the clock would
        cursor.execute(
            "UPDATE broker_delivery SET invisible_until = now() - interval '1 second' "
            "WHERE id = %s",
            [delivery_of(first["receipt_handle"]).pk],
        )
    [second] = receive(api)
    assert second["msg_id"] == first["msg_id"]
    old, new = first["receipt_handle"], second["receipt_handle"]
    held = delivery_of(new)
    payload = {"receipt_handle": old, "invisible_seconds": 300}
    response = api.post("/api/v1/consumer-groups/billing/change-invisible", payload, format="json")
    assert response.status_code == 400, response.json()
    with pytest.raises(BrokerError):
        dead_letters.message_dead_letter(
            group=ConsumerGroup.objects.get(name="billing"), receipt_handle=old
        )
    after = delivery_of(new)
    assert (after.state, after.invisible_until, after.handle_token) == (
        "INFLIGHT",
        held.invisible_until,
        held.handle_token,
    )
    assert ack(api, new) == {"acked": [new], "invalid": []}  # the latest receive's handle acts


def test_a_handle_whose_message_was_dead_lettered_or_acked_acks_nothing(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    send(api)
    send(api)
    given_up, acked = (message["receipt_handle"] for message in receive(api))
    group = ConsumerGroup.objects.get(name="billing")
    dead_letters.message_dead_letter(group=group, receipt_handle=given_up)
    assert ack(api, given_up) == {"acked": [], "invalid": [given_up]}
    assert delivery_of(given_up).state == "DLQ"  # still in the dead-letter queue
    assert ack(api, acked) == {"acked": [acked], "invalid": []}
    first_ack = delivery_of(acked).acked_at
    assert ack(api, acked) == {"acked": [], "invalid": [acked]}  # a reused handle
    assert delivery_of(acked).acked_at == first_ack


def test_a_change_of_invisible_time_racing_an_ack_waits_for_it_and_is_refused(
    transactional_db: None, api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    send(api)
    [message] = receive(api)
    handle = message["receipt_handle"]
    group = ConsumerGroup.objects.get(name="billing")
    acked = threading.Event()

    def ack_then_commit_a_moment_later() -> list[str]:
        with transaction.atomic():
            done, _ = consuming.message_ack(group=group, receipt_handles=[handle])
            acked.set()
            threading.Event().wait(1)  # the change below reads the row meanwhile
        return done

    acking = in_thread(ack_then_commit_a_moment_later)
    assert acked.wait(timeout=10)
    with pytest.raises(BrokerError):
        consuming.message_change_invisible(group=group, receipt_handle=handle, invisible_seconds=60)
    assert acking.result(timeout=30) == [handle]
    assert delivery_of(handle).state == "ACKED"


def test_a_last_attempt_in_flight_is_not_dead_lettered_before_its_invisible_time_ends(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic(max_delivery_attempts=1)
    send(api)
    [message] = receive(api)  # its one attempt, invisible for 10 s
    handle = message["receipt_handle"]
    assert dead_letters.deliveries_expire() == 0
    assert receive(api) == []
    assert delivery_of(handle).state == "INFLIGHT"
    assert ack(api, handle) == {"acked": [handle], "invalid": []}


def test_a_resend_of_a_message_not_in_the_dead_letter_queue_changes_nothing(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    send(api)
    send(api)
    acked, in_flight = receive(api)
    assert ack(api, acked["receipt_handle"])["acked"] == [acked["receipt_handle"]]
    group = ConsumerGroup.objects.get(name="billing")
    for message in (acked, in_flight):
        with pytest.raises(NotFound):
            dead_letters.dlq_resend(group=group, msg_id=message["msg_id"])
    assert delivery_of(acked["receipt_handle"]).state == "ACKED"  # never delivered again
    assert receive(api) == []
    handle = in_flight["receipt_handle"]
    assert ack(api, handle) == {"acked": [handle], "invalid": []}  # its handle still acts
