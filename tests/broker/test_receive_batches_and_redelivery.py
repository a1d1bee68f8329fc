"""What one receive hands out (found by the mutation review of decision 0112): never more than
`max_messages`, whether they are redeliveries, a FIFO group's released heads or new messages, with
or without a tag filter; expired deliveries go again oldest expiry first, and only those its tag
filter takes (services/consuming.py)."""

from typing import Any

from django.db import connection
from rest_framework.test import APIClient

from apps.broker.models import Delivery
from tests.support.responses import expect


def send(api: APIClient, body: str, **fields: Any) -> dict[str, Any]:
    payload = {"producer_group": "order-service", "body": body, **fields}
    return dict(expect(api.post("/api/v1/topics/orders/messages", payload, format="json"), 201))


def receive(api: APIClient, **extra: Any) -> list[dict[str, Any]]:
    payload = {"topic": "orders", "invisible_seconds": 10, **extra}
    answer = api.post("/api/v1/consumer-groups/billing/receive", payload, format="json")
    return list(expect(answer, 200)["messages"])


def ack(api: APIClient, *messages: dict[str, Any]) -> None:
    handles = [m["receipt_handle"] for m in messages]
    answer = api.post("/api/v1/consumer-groups/billing/ack", {"receipt_handles": handles}, "json")
    assert expect(answer, 200)["acked"] == handles


def expire(message: dict[str, Any], seconds_ago: float = 1) -> None:
    """The message's invisible time ran out `seconds_ago`, as the clock would have it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE broker_delivery SET invisible_until = now() - make_interval(secs => %s) "
            "WHERE id = %s",
            [seconds_ago, int(message["receipt_handle"].split(".")[0])],
        )


def bodies(messages: list[dict[str, Any]]) -> list[str]:
    return [m["body"] for m in messages]


def test_redeliveries_and_new_messages_together_fill_the_batch_and_no_more(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic(queues=1)
    for body in ("a", "b", "c", "d"):
        send(api, body)
    first, _ = receive(api, max_messages=2)
    expire(first)
    # One redelivery and one of the two new messages: the two asked for, the redelivery first.
    got = receive(api, max_messages=2)
    assert [(m["body"], m["delivery_attempt"]) for m in got] == [("a", 2), ("c", 1)]
    assert bodies(receive(api, max_messages=2)) == ["d"]


def test_expired_deliveries_go_again_oldest_expiry_first_up_to_the_batch(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic(queues=1)
    for body in ("a", "b", "c"):
        send(api, body)
    a, b, c = receive(api, max_messages=3)
    expire(b, seconds_ago=30)
    expire(c, seconds_ago=20)
    expire(a, seconds_ago=10)
    assert bodies(receive(api, max_messages=2)) == ["b", "c"]
    assert bodies(receive(api, max_messages=2)) == ["a"]


def test_a_redelivery_hands_out_only_what_its_tag_filter_takes(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic(queues=1)
    send(api, "a", tags="TagA")
    send(api, "b", tags="TagB")
    taken = receive(api)  # no filter: both in flight
    for message in taken:
        expire(message)
    assert [(m["body"], m["delivery_attempt"]) for m in receive(api, tag_expression="TagA")] == [
        ("a", 2)
    ]
    assert [(m["body"], m["delivery_attempt"]) for m in receive(api, tag_expression="TagB")] == [
        ("b", 2)
    ]


def test_a_filtered_receive_over_several_queues_takes_no_more_than_the_batch(
    api: APIClient, setup_topic: Any
) -> None:
    """Each queue holds A, B, A, A (its message group puts it there). A receive of three TagA
    reads three entries of the first queue it reads (two match), then one of the other."""
    setup_topic(queues=2)
    queues = {
        send(api, f"{group}-{tag}{n}", tags=f"Tag{tag}", message_group=group)["queue_id"]
        for group in ("left", "right")
        for n, tag in enumerate("ABAA")
    }
    assert queues == {0, 1}  # "left" and "right" hash to different queues (sending.py)
    got = receive(api, max_messages=3, tag_expression="TagA")
    assert len(got) == 3
    assert {m["body"][-2] for m in got} == {"A"}
    rest = receive(api, max_messages=32, tag_expression="TagA")
    assert len(rest) == 3  # six TagA in all: none lost, none twice
    assert {m["msg_id"] for m in got}.isdisjoint(m["msg_id"] for m in rest)


def test_a_fifo_groups_released_heads_fill_what_redeliveries_left_of_the_batch(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic(queues=1, fifo=True)
    send(api, "x1", message_group="x")
    send(api, "x2", message_group="x")
    send(api, "y1", message_group="y")
    send(api, "y2", message_group="y")
    send(api, "free")  # no message group: received as in any group
    first = {m["body"]: m for m in receive(api, max_messages=32)}
    assert sorted(first) == ["free", "x1", "y1"]  # x2 and y2 wait for their groups
    ack(api, first["x1"], first["y1"])  # x2 and y2 are free to go
    expire(first["free"])
    got = receive(api, max_messages=2)
    assert [(m["body"], m["delivery_attempt"]) for m in got] == [("free", 2), ("x2", 1)]
    assert bodies(receive(api, max_messages=2)) == ["y2"]
    assert not Delivery.objects.filter(state="HELD").exists()
