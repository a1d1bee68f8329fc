"""Message groups and FIFO consumer groups (issue 29, docs/decisions/0054): a group's messages
share a queue in commit order; a FIFO consumer group receives them one at a time, in order."""

import hashlib
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from apps.broker.models import CommitLogEntry, DelayedMessage, Delivery, HalfMessage
from tests.support.responses import assert_error, expect


def send(api: APIClient, body: str, group: str | None = None, topic: str = "orders") -> Any:
    payload: dict[str, Any] = {"producer_group": "order-service", "body": body}
    if group is not None:
        payload["message_group"] = group
    return expect(api.post(f"/api/v1/topics/{topic}/messages", payload, format="json"), 201)


def receive(api: APIClient, group: str = "billing", **extra: Any) -> list[dict[str, Any]]:
    payload = {"topic": "orders", "invisible_seconds": 10, **extra}
    answer = expect(
        api.post(f"/api/v1/consumer-groups/{group}/receive", payload, format="json"), 200
    )
    return list(answer["messages"])


def bodies(messages: list[dict[str, Any]]) -> list[str]:
    return sorted(m["body"] for m in messages)


def ack(api: APIClient, *messages: dict[str, Any], group: str = "billing") -> None:
    handles = [m["receipt_handle"] for m in messages]
    answer = expect(
        api.post(
            f"/api/v1/consumer-groups/{group}/ack", {"receipt_handles": handles}, format="json"
        ),
        200,
    )
    assert answer["acked"] == handles, answer


def expire_in_flight() -> None:
    """Every in-flight message's invisible time runs out now (the database's clock)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE broker_delivery SET invisible_until = now() - interval '1 second' "
            "WHERE state = 'INFLIGHT'"
        )


def queue_of(group: str, queues: int) -> int:
    return int(hashlib.sha256(group.encode()).hexdigest()[:8], 16) % queues


def test_a_groups_messages_share_one_queue_and_the_answer_names_the_group(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic(queues=8)
    sent = [send(api, f"m{i}", group="order-9527") for i in range(6)]
    assert {s["queue_id"] for s in sent} == {queue_of("order-9527", 8)}
    assert [s["queue_offset"] for s in sent] == list(range(6))
    assert {s["message_group"] for s in sent} == {"order-9527"}
    assert send(api, "plain")["message_group"] is None
    stored = CommitLogEntry.objects.filter(message_group="order-9527").count()
    assert stored == 6
    # Without a group, messages spread over the queues (positive control for the above).
    spread = {send(api, f"p{i}")["queue_id"] for i in range(40)}
    assert len(spread) > 1


def test_a_fifo_group_hands_out_one_message_of_a_group_at_a_time_in_order(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic(queues=2, fifo=True)
    for i in range(3):
        send(api, f"a{i}", group="A")
        send(api, f"b{i}", group="B")
    send(api, "free1")
    send(api, "free2")
    first = receive(api, max_messages=32)
    assert bodies(first) == ["a0", "b0", "free1", "free2"]
    assert {m["message_group"] for m in first} == {"A", "B", None}
    assert receive(api, max_messages=32) == []  # a1 and b1 wait for a0 and b0
    ack(api, *[m for m in first if m["body"] == "a0"])
    second = receive(api, max_messages=32)
    assert bodies(second) == ["a1"]
    ack(api, *[m for m in first if m["body"] != "a0"], *second)
    assert bodies(receive(api, max_messages=32)) == ["a2", "b1"]


def test_a_normal_group_ignores_message_groups(api: APIClient, setup_topic: Any) -> None:
    setup_topic(queues=2)
    for i in range(3):
        send(api, f"a{i}", group="A")
    assert bodies(receive(api, max_messages=32)) == ["a0", "a1", "a2"]
    assert not Delivery.objects.filter(state="HELD").exists()


def test_an_expired_head_comes_back_before_the_next_message_of_its_group(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic(queues=1, fifo=True)
    send(api, "a0", group="A")
    send(api, "a1", group="A")
    [head] = receive(api)
    assert head["body"] == "a0"
    expire_in_flight()
    [again] = receive(api, max_messages=32)
    assert (again["body"], again["delivery_attempt"]) == ("a0", 2)
    ack(api, again)
    [after] = receive(api)
    assert (after["body"], after["delivery_attempt"]) == ("a1", 1)


def test_a_head_awaiting_redelivery_holds_its_group_from_a_receive_that_filters_it_out(
    api: APIClient, setup_topic: Any
) -> None:
    # CONTRACT section 7: a later message is not received while an earlier one is in flight or
    # awaiting redelivery, whichever tags the receive asks for.
    setup_topic(queues=1, fifo=True)
    message = {"producer_group": "order-service", "message_group": "A"}
    path = "/api/v1/topics/orders/messages"
    expect(api.post(path, {**message, "body": "a0", "tags": "created"}, format="json"), 201)
    [head] = receive(api)
    expire_in_flight()
    expect(api.post(path, {**message, "body": "a1", "tags": "paid"}, format="json"), 201)
    assert receive(api, max_messages=32, tag_expression="paid") == []
    [again] = receive(api, max_messages=32)
    assert (again["body"], again["delivery_attempt"]) == ("a0", 2)
    ack(api, again)
    [after] = receive(api, tag_expression="paid")
    assert after["body"] == "a1"


def test_dead_lettering_the_head_releases_the_next_message(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic(queues=1, fifo=True, max_delivery_attempts=2)
    send(api, "a0", group="A")
    send(api, "a1", group="A")
    assert bodies(receive(api)) == ["a0"]
    expire_in_flight()
    assert bodies(receive(api)) == ["a0"]  # its second and last attempt
    expire_in_flight()
    assert bodies(receive(api)) == ["a1"]  # a0 went to the dead-letter queue
    assert Delivery.objects.get(message__body=b"a0").state == "DLQ"


def test_a_resent_dead_letter_goes_back_into_its_groups_order(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic(queues=1, fifo=True, max_delivery_attempts=1)
    send(api, "a0", group="A")
    send(api, "a1", group="A")
    [a0] = receive(api)
    expire_in_flight()
    [a1] = receive(api)
    assert a1["body"] == "a1"
    resent = api.post("/api/v1/consumer-groups/billing/dlq/" + a0["msg_id"] + "/resend")
    expect(resent, 200)
    assert receive(api) == []  # a1 is in flight: a0 waits behind it
    ack(api, a1)
    assert bodies(receive(api)) == ["a0"]


def test_a_stuck_group_does_not_hold_up_another_group_in_the_same_queue(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic(queues=1, fifo=True)
    send(api, "stuck0", group="stuck")
    for i in range(100):
        send(api, f"stuck{i + 1}", group="stuck")
    send(api, "other0", group="other")
    assert bodies(receive(api)) == ["stuck0"]
    # Read past the stuck group's backlog, receive after receive, to the other group's message.
    found: list[str] = []
    for _ in range(5):
        found += [m["body"] for m in receive(api, max_messages=1)]
    assert found == ["other0"]


def test_transactions_of_a_group_arrive_in_commit_order(api: APIClient, setup_topic: Any) -> None:
    setup_topic(queues=4, fifo=True)
    prepared = {}
    for name in ("A", "B", "C"):
        payload = {
            "producer_group": "order-service",
            "topic": "orders",
            "body": name,
            "message_group": "order-9527",
        }
        prepared[name] = expect(api.post("/api/v1/transactions", payload, format="json"), 201)
        assert prepared[name]["message_group"] == "order-9527"
    for name in ("B", "A"):
        tx = prepared[name]["transaction_id"]
        expect(api.post(f"/api/v1/transactions/{tx}/commit", format="json"), 200)
    # C stays PREPARED: it never holds its group up.
    received = []
    for _ in range(2):
        [message] = receive(api)
        received.append(message["body"])
        ack(api, message)
    assert received == ["B", "A"]
    assert receive(api) == []
    assert HalfMessage.objects.get(body=b"C").queue_id == queue_of("order-9527", 4)


@pytest.mark.parametrize(
    "value",
    ["", " ", "\t", "a\nb", "a\x00b", "x" * 129, "a\x7fb", "a\x85b", 7, None, ["a"], {"a": 1}],
)
def test_a_bad_message_group_is_refused_and_nothing_stored(
    api: APIClient, setup_topic: Any, value: Any
) -> None:
    setup_topic()
    payload = {"producer_group": "order-service", "body": "x", "message_group": value}
    error = assert_error(
        api.post("/api/v1/topics/orders/messages", payload, format="json"), 400, "invalid_request"
    )
    assert "message_group" in error["details"], error
    tx = {**payload, "topic": "orders"}
    error = assert_error(
        api.post("/api/v1/transactions", tx, format="json"), 400, "invalid_request"
    )
    assert "message_group" in error["details"], error
    assert not CommitLogEntry.objects.exists()
    assert not HalfMessage.objects.exists()


def test_a_good_message_group_of_any_printable_characters_is_taken(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    for value in ("x" * 128, "订单-9527", "a b", "emoji 🚀"):
        assert send(api, "x", group=value)["message_group"] == value


def in_a_minute() -> str:
    return (timezone.now() + timedelta(seconds=60)).isoformat()


@pytest.mark.parametrize("delay", ["delay_level", "deliver_at"])
@pytest.mark.parametrize("path", ["/api/v1/topics/orders/messages", "/api/v1/transactions"])
def test_a_message_group_with_a_delay_is_refused(
    api: APIClient, setup_topic: Any, delay: str, path: str
) -> None:
    setup_topic()
    payload: dict[str, Any] = {"producer_group": "order-service", "body": "x"}
    if path == "/api/v1/transactions":
        payload["topic"] = "orders"
    payload[delay] = 1 if delay == "delay_level" else in_a_minute()
    expect(api.post(path, payload, format="json"), 201)  # positive control: no group
    stored = (HalfMessage.objects.count(), DelayedMessage.objects.count())
    error = assert_error(
        api.post(path, {**payload, "message_group": "g"}, format="json"), 400, "invalid_request"
    )
    assert "message_group" in error["details"], error
    assert (HalfMessage.objects.count(), DelayedMessage.objects.count()) == stored
    assert not CommitLogEntry.objects.exists()


def test_batches_take_message_groups_and_refuse_a_delayed_one(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic(queues=8)
    messages: list[dict[str, Any]] = [{"body": f"m{i}", "message_group": "g"} for i in range(5)]
    batch = {"producer_group": "order-service", "messages": messages}
    answer = expect(api.post("/api/v1/topics/orders/messages:batch", batch, format="json"), 201)
    assert {r["queue_id"] for r in answer["results"]} == {queue_of("g", 8)}
    messages.append({"body": "late", "message_group": "g", "delay_level": 3})
    assert_error(
        api.post("/api/v1/topics/orders/messages:batch", batch, format="json"),
        400,
        "invalid_request",
    )
    assert CommitLogEntry.objects.count() == 5


def test_a_consumer_group_is_fifo_only_when_asked_with_a_json_boolean(api: APIClient) -> None:
    created = expect(
        api.post("/api/v1/consumer-groups", {"name": "f", "fifo": True}, format="json"), 201
    )
    assert created["fifo"] is True
    plain = expect(api.post("/api/v1/consumer-groups", {"name": "p"}, format="json"), 201)
    assert plain["fifo"] is False
    for bad in ("true", 1, None):
        error = assert_error(
            api.post("/api/v1/consumer-groups", {"name": "x", "fifo": bad}, format="json"),
            400,
            "invalid_request",
        )
        assert "fifo" in error["details"], error


def test_held_messages_count_as_ready_in_the_groups_status_and_lag(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic(queues=1, fifo=True)
    for i in range(3):
        send(api, f"a{i}", group="A")
    assert bodies(receive(api)) == ["a0"]
    [queue] = expect(api.get("/api/v1/consumer-groups/billing"), 200)["queues"]
    assert (queue["ready"], queue["in_flight"], queue["lag"]) == (2, 1, 3), queue
    from apps.broker import selectors

    [lag] = [row for row in selectors.consumer_lag() if row["group"] == "billing"]
    assert lag["lag"] == 3, lag


def test_a_fifo_group_passes_over_what_its_tag_expression_filters_out(
    api: APIClient, setup_topic: Any
) -> None:
    # As a normal group does, and as in RocketMQ: a message the receive's tag expression does
    # not match is passed over for the group, whatever its message group.
    setup_topic(queues=1, fifo=True)
    path = "/api/v1/topics/orders/messages"
    for body, tag, group in (("a0", "created", "A"), ("b0", "paid", "B"), ("c0", "paid", "")):
        payload = {"producer_group": "order-service", "body": body, "tags": tag}
        if group:
            payload["message_group"] = group
        expect(api.post(path, payload, format="json"), 201)
    got = receive(api, max_messages=32, tag_expression="paid")
    assert bodies(got) == ["b0", "c0"]
    ack(api, *got)
    assert receive(api, max_messages=32) == []
    assert not Delivery.objects.filter(message__body=b"a0").exists()
