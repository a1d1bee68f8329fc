"""Receipt handles, changes of invisible time and the dead-letter queue, as the REST door answers
them (found by the mutation review of decision 0112): a handle is read whole, and acts only until
its invisible time runs out; a change of invisible time counts from now and is no delivery
attempt; the dead-letter queue lists oldest first, and a resend sends back its own group's dead
letter only (services/handles.py, services/consuming.py, services/dead_letters.py)."""

from datetime import timedelta
from typing import Any

from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from apps.broker.models import Delivery
from apps.broker.services import dead_letters
from tests.support.responses import assert_error, expect


def send(api: APIClient, body: str = "m") -> dict[str, Any]:
    payload = {"producer_group": "order-service", "body": body}
    return dict(expect(api.post("/api/v1/topics/orders/messages", payload, format="json"), 201))


def receive(api: APIClient, group: str = "billing", **extra: Any) -> list[dict[str, Any]]:
    payload = {"topic": "orders", "invisible_seconds": 10, **extra}
    answer = api.post(f"/api/v1/consumer-groups/{group}/receive", payload, format="json")
    return list(expect(answer, 200)["messages"])


def ack(api: APIClient, handles: list[str]) -> dict[str, Any]:
    answer = api.post("/api/v1/consumer-groups/billing/ack", {"receipt_handles": handles}, "json")
    return dict(expect(answer, 200))


def change_invisible(api: APIClient, handle: str, seconds: int) -> Any:
    payload = {"receipt_handle": handle, "invisible_seconds": seconds}
    return api.post("/api/v1/consumer-groups/billing/change-invisible", payload, format="json")


def delivery_of(handle: str) -> Delivery:
    return Delivery.objects.get(pk=int(handle.split(".")[0]))


def expire_all(seconds_ago: float = 1) -> None:
    """Every in-flight invisible time ran out `seconds_ago`, as the clock would have it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE broker_delivery SET invisible_until = now() - make_interval(secs => %s) "
            "WHERE state = 'INFLIGHT'",
            [seconds_ago],
        )


def test_a_handle_is_read_whole(api: APIClient, setup_topic: Any) -> None:
    setup_topic()
    send(api)
    [message] = receive(api)
    handle = message["receipt_handle"]
    for longer in (f"{handle}!", f"{handle} ", f"{handle}\n", f"{handle}.1"):
        assert ack(api, [longer]) == {"acked": [], "invalid": [longer]}
        assert_error(change_invisible(api, longer, 60), 400, "invalid_request")
    assert delivery_of(handle).state == "INFLIGHT"
    assert ack(api, [handle]) == {"acked": [handle], "invalid": []}


def test_a_change_of_invisible_time_counts_from_now_and_is_no_attempt(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    send(api)
    [message] = receive(api, invisible_seconds=43200)
    before = timezone.now()
    changed = expect(change_invisible(api, message["receipt_handle"], 10), 200)
    after = timezone.now()
    assert changed["delivery_attempt"] == 1
    until = delivery_of(changed["receipt_handle"]).invisible_until
    assert before + timedelta(seconds=10) <= until <= after + timedelta(seconds=10)
    expire_all()
    [again] = receive(api)
    assert (again["msg_id"], again["delivery_attempt"]) == (message["msg_id"], 2)


def test_the_dead_letter_queue_lists_oldest_first(api: APIClient, setup_topic: Any) -> None:
    setup_topic(max_delivery_attempts=1)
    sent = [send(api, body)["msg_id"] for body in ("a", "b", "c")]
    receive(api)
    expire_all()
    assert dead_letters.deliveries_expire() == 3
    order = [sent[1], sent[2], sent[0]]
    for minutes, msg_id in zip((30, 20, 10), order, strict=True):
        Delivery.objects.filter(message__msg_id=msg_id).update(
            dlq_at=timezone.now() - timedelta(minutes=minutes)
        )
    listed = expect(api.get("/api/v1/consumer-groups/billing/dlq"), 200)["results"]
    assert [entry["msg_id"] for entry in listed] == order


def test_a_resend_sends_back_its_own_groups_dead_letter_only(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic(max_delivery_attempts=1)
    audit = {"name": "audit", "max_delivery_attempts": 1}
    expect(api.post("/api/v1/consumer-groups", audit, format="json"), 201)
    msg_id = send(api)["msg_id"]
    receive(api)
    receive(api, group="audit")
    expire_all()
    assert dead_letters.deliveries_expire() == 2
    expect(api.post(f"/api/v1/consumer-groups/billing/dlq/{msg_id}/resend"), 200)
    audit_dlq = expect(api.get("/api/v1/consumer-groups/audit/dlq"), 200)["results"]
    assert [entry["msg_id"] for entry in audit_dlq] == [msg_id]
    assert receive(api, group="audit") == []
    [again] = receive(api)
    assert (again["msg_id"], again["delivery_attempt"]) == (msg_id, 1)


def test_a_handle_whose_invisible_time_ran_out_changes_nothing(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    send(api)
    [message] = receive(api)
    handle = message["receipt_handle"]
    # A second of invisible time left: the handle still acts (a new handle, the same attempt).
    Delivery.objects.update(invisible_until=timezone.now() + timedelta(seconds=1))
    changed = expect(change_invisible(api, handle, 10), 200)
    assert changed["delivery_attempt"] == 1
    handle = changed["receipt_handle"]
    expire_all()  # run out a second ago, not received again yet
    ran_out = delivery_of(handle)
    assert_error(change_invisible(api, handle, 60), 400, "invalid_request")
    after = delivery_of(handle)
    assert (after.invisible_until, after.handle_token) == (
        ran_out.invisible_until,
        ran_out.handle_token,
    )
    [again] = receive(api)
    assert (again["msg_id"], again["delivery_attempt"]) == (message["msg_id"], 2)
