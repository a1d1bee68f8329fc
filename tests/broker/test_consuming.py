"""Consumers: invisible time, redelivery, dead-letter queue, resend, tags, long polling
(CONTRACT invariant 6)."""

import threading
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from apps.broker.models import ConsumerGroup, Delivery, Topic
from apps.broker.services import consuming, dead_letters
from apps.broker.services.consuming import WaitPlan
from tests.support.responses import assert_error, expect


def send(
    api: APIClient, body: str = "m", tags: str | None = None, topic: str = "orders"
) -> dict[str, Any]:
    payload: dict[str, Any] = {"producer_group": "order-service", "body": body}
    if tags:
        payload["tags"] = tags
    response = api.post(f"/api/v1/topics/{topic}/messages", payload, format="json")
    assert response.status_code == 201, response.json()
    return dict(response.json())


def receive(api: APIClient, group: str = "billing", **extra: Any) -> list[dict[str, Any]]:
    payload = {"topic": "orders", "invisible_seconds": 10, **extra}
    response = api.post(f"/api/v1/consumer-groups/{group}/receive", payload, format="json")
    assert response.status_code == 200, response.json()
    return list(response.json()["messages"])


def ack(api: APIClient, handles: list[str], group: str = "billing") -> dict[str, Any]:
    response = api.post(
        f"/api/v1/consumer-groups/{group}/ack", {"receipt_handles": handles}, format="json"
    )
    assert response.status_code == 200
    return dict(response.json())


def invisible_time_passes(api: APIClient, message: dict[str, Any]) -> None:
    """What 10.3 s of the clock do to a message received for 10 s: it was invisible for exactly
    that long, still is, and no longer is once its delivery's times are 10.3 s earlier."""
    delivery = Delivery.objects.get(pk=int(message["receipt_handle"].split(".")[0]))
    assert delivery.last_received_at is not None
    assert delivery.invisible_until - delivery.last_received_at == timedelta(seconds=10)
    assert delivery.invisible_until > timezone.now()
    assert receive(api) == []
    Delivery.objects.filter(pk=delivery.pk).update(
        invisible_until=F("invisible_until") - timedelta(seconds=10.3),
        last_received_at=F("last_received_at") - timedelta(seconds=10.3),
    )


def test_a_received_message_is_invisible_until_acked_or_expired(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    sent = send(api)
    [first] = receive(api)
    assert first["msg_id"] == sent["msg_id"]
    assert first["delivery_attempt"] == 1
    assert receive(api) == []
    assert ack(api, [first["receipt_handle"]]) == {
        "acked": [first["receipt_handle"]],
        "invalid": [],
    }
    assert receive(api) == []


def test_unacked_comes_back_after_its_invisible_time_then_goes_to_the_dlq_and_resend_returns_it(
    api: APIClient, setup_topic: Any
) -> None:
    """invisible_seconds is at least 10 by contract; the clock moves with SQL instead of a
    sleep (issue 27). tests/e2e/test_waiting_costs_nothing.py waits out one in real time."""
    setup_topic(max_delivery_attempts=2)
    sent = send(api)
    [first] = receive(api)
    invisible_time_passes(api, first)
    [second] = receive(api)
    assert second["msg_id"] == sent["msg_id"]
    assert second["delivery_attempt"] == 2
    assert ack(api, [first["receipt_handle"]])["invalid"] == [first["receipt_handle"]]
    invisible_time_passes(api, second)
    assert receive(api) == []  # attempts used up: dead-lettered, not delivered a third time
    dlq = api.get("/api/v1/consumer-groups/billing/dlq").json()
    assert [m["msg_id"] for m in dlq["results"]] == [sent["msg_id"]]
    assert dlq["results"][0]["body"] == "m"
    status = api.get("/api/v1/consumer-groups/billing").json()
    assert sum(q["dlq"] for q in status["queues"]) == 1
    assert ack(api, [second["receipt_handle"]])["invalid"] == [second["receipt_handle"]]
    resent = api.post(f"/api/v1/consumer-groups/billing/dlq/{sent['msg_id']}/resend")
    assert resent.status_code == 200
    [again] = receive(api)
    assert again["msg_id"] == sent["msg_id"]
    assert again["delivery_attempt"] == 1
    assert ack(api, [again["receipt_handle"]])["acked"] == [again["receipt_handle"]]
    assert api.get("/api/v1/consumer-groups/billing/dlq").json()["count"] == 0


def test_an_expired_handle_is_invalid_and_never_fails_the_batch(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    send(api, "a")
    send(api, "b")
    messages = receive(api)
    assert len(messages) == 2
    expired, fresh = messages
    # Let the first one's invisible time pass, as the clock would.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE broker_delivery SET invisible_until = now() - interval '1 second' "
            "WHERE id = %s",
            [int(expired["receipt_handle"].split(".")[0])],
        )
    result = ack(api, [expired["receipt_handle"], fresh["receipt_handle"], "garbage", "9.x"])
    assert result == {
        "acked": [fresh["receipt_handle"]],
        "invalid": [expired["receipt_handle"], "garbage", "9.x"],
    }


def test_another_groups_handle_is_invalid(api: APIClient, setup_topic: Any) -> None:
    setup_topic()
    expect(api.post("/api/v1/consumer-groups", {"name": "audit"}, format="json"), 201)
    send(api)
    [message] = receive(api)
    assert ack(api, [message["receipt_handle"]], group="audit")["invalid"] == [
        message["receipt_handle"]
    ]


def test_each_consumer_group_gets_every_message(api: APIClient, setup_topic: Any) -> None:
    setup_topic()
    expect(api.post("/api/v1/consumer-groups", {"name": "audit"}, format="json"), 201)
    ids = {send(api, str(i))["msg_id"] for i in range(5)}
    assert {m["msg_id"] for m in receive(api)} == ids
    assert {m["msg_id"] for m in receive(api, group="audit")} == ids


def test_change_invisible_gives_a_new_handle_and_retires_the_old(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    send(api)
    [message] = receive(api)
    response = api.post(
        "/api/v1/consumer-groups/billing/change-invisible",
        {"receipt_handle": message["receipt_handle"], "invisible_seconds": 120},
        format="json",
    )
    assert response.status_code == 200
    new_handle = response.json()["receipt_handle"]
    assert new_handle != message["receipt_handle"]
    assert ack(api, [message["receipt_handle"], new_handle]) == {
        "acked": [new_handle],
        "invalid": [message["receipt_handle"]],
    }
    stale = api.post(
        "/api/v1/consumer-groups/billing/change-invisible",
        {"receipt_handle": message["receipt_handle"], "invisible_seconds": 120},
        format="json",
    )
    assert_error(stale, 400, "invalid_request")


def test_tag_expression_filters(api: APIClient, setup_topic: Any) -> None:
    setup_topic(queues=1)
    a = send(api, tags="TagA")
    send(api, tags="TagB")
    c = send(api, tags="TagC")
    got = receive(api, tag_expression="TagA || TagC")
    assert [m["msg_id"] for m in got] == [a["msg_id"], c["msg_id"]]


def test_what_a_tag_expression_filters_out_is_passed_over_for_the_group(
    api: APIClient, setup_topic: Any
) -> None:
    """As in RocketMQ: the group's cursor moves past messages its expression does not match, so
    a later receive with another expression does not get them; another group still does."""
    setup_topic(queues=1)
    b1 = send(api, tags="TagB")
    a1 = send(api, tags="TagA")
    b2 = send(api, tags="TagB")
    assert [m["msg_id"] for m in receive(api, tag_expression="TagA")] == [a1["msg_id"]]
    assert receive(api, tag_expression="TagB") == []  # b1, b2 were passed over
    assert receive(api) == []
    b3 = send(api, tags="TagB")
    assert [m["msg_id"] for m in receive(api, tag_expression="TagB")] == [b3["msg_id"]]
    expect(api.post("/api/v1/consumer-groups", {"name": "audit"}, format="json"), 201)
    everything = [m["msg_id"] for m in receive(api, group="audit")]
    assert everything == [m["msg_id"] for m in (b1, a1, b2, b3)]


def test_an_expired_delivery_the_expression_does_not_match_is_not_redelivered_to_it(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic(queues=1)
    b = send(api, tags="TagB")
    [taken] = receive(api)  # no expression: in flight
    assert taken["msg_id"] == b["msg_id"]
    Delivery.objects.update(invisible_until=timezone.now())  # its invisible time ran out
    assert receive(api, tag_expression="TagA") == []
    [again] = receive(api, tag_expression="TagB")
    assert (again["msg_id"], again["delivery_attempt"]) == (b["msg_id"], 2)


def test_a_filtered_receive_beside_expired_deliveries_it_does_not_take_is_one_read(
    api: APIClient, setup_topic: Any
) -> None:
    """Decision 0081: an expired delivery a receive's tag expression does not match is nothing
    receivable for it. Counted, it made each such receive a write transaction that took nothing
    (and a waiting one was woken for it every second)."""
    setup_topic(queues=1, max_delivery_attempts=2)
    b = send(api, tags="TagB")
    receive(api)  # no expression: in flight
    Delivery.objects.update(invisible_until=timezone.now())  # its invisible time ran out
    plan = WaitPlan(
        group=ConsumerGroup.objects.get(name="billing"),
        topic=Topic.objects.get(name="orders"),
        max_messages=1,
        invisible_seconds=10,
        wait_seconds=5,
        tags=frozenset({"TagA"}),
    )
    with CaptureQueriesContext(connection) as queries:
        assert consuming.receive_now(plan) == ([], False)
    assert len(queries) == 1, [q["sql"] for q in queries]  # the read: no lock, no write
    # The receive that takes it still finds it (its second attempt, of two).
    received, anything = consuming.receive_now(replace(plan, tags=frozenset({"TagC", "TagB"})))
    assert anything
    assert [(r.message.msg_id, r.delivery.attempts) for r in received] == [(b["msg_id"], 2)]
    # Exhausted, it is passed over too, and reaches the dead-letter queue by the periodic scan.
    Delivery.objects.update(invisible_until=timezone.now())
    assert consuming.receive_now(plan) == ([], False)
    assert dead_letters.deliveries_expire() == 1
    assert Delivery.objects.get().state == "DLQ"


def test_consume_from_last_skips_what_was_there_before(api: APIClient, setup_topic: Any) -> None:
    setup_topic(consume_from="last")
    send(api, "old")
    assert receive(api) == []
    new = send(api, "new")
    assert [m["msg_id"] for m in receive(api)] == [new["msg_id"]]


def test_long_polling_answers_as_soon_as_a_message_arrives(
    api: APIClient, setup_topic: Any, make_client: Any, transactional_db: None
) -> None:
    setup_topic()
    producer = make_client("admin")
    timer = threading.Timer(1.0, lambda: send(producer, "late"))
    started = time.monotonic()
    timer.start()
    messages = receive(api, wait_seconds=10)
    elapsed = time.monotonic() - started
    timer.join()
    assert [m["body"] for m in messages] == ["late"]
    assert 0.9 < elapsed < 9, elapsed  # woke on the message, not at the end of the wait


def test_long_polling_with_nothing_waits_the_whole_time(api: APIClient, setup_topic: Any) -> None:
    setup_topic()
    started = time.monotonic()
    assert receive(api, wait_seconds=1) == []
    assert time.monotonic() - started >= 1


def test_group_status_shows_lag_in_flight_and_offsets(api: APIClient, setup_topic: Any) -> None:
    setup_topic(queues=1)
    for i in range(3):
        send(api, str(i))
    [message] = receive(api, max_messages=1)
    status = api.get("/api/v1/consumer-groups/billing").json()
    assert status["queues"] == [
        {
            "topic": "orders",
            "queue_id": 0,
            "max_offset": 3,
            "consumer_offset": 1,
            "ready": 2,
            "in_flight": 1,
            "lag": 3,
            "dlq": 0,
        },
    ]
    ack(api, [message["receipt_handle"]])
    assert api.get("/api/v1/consumer-groups/billing").json()["queues"][0]["lag"] == 2
    assert Delivery.objects.get().state == "ACKED"


def test_a_receive_waits_for_another_consumers_cursors_instead_of_answering_nothing(
    api: APIClient, setup_topic: Any, transactional_db: None
) -> None:
    """Another consumer of the group holds every cursor of the topic (its receive is running):
    a receive with messages there waits the few milliseconds for them rather than answering
    nothing (which would leave it waiting for a NOTIFY that may never come)."""
    import psycopg

    from tests.conftest import db_url_for_tests

    setup_topic(queues=2)
    for n in range(4):
        send(api, f"m{n}")
    [first] = receive(api, max_messages=1)  # the group's cursors exist now
    released = threading.Event()
    with psycopg.connect(db_url_for_tests()) as holder:
        holder.execute(
            "SELECT c.id FROM broker_consumercursor c JOIN broker_consumergroup g "
            "ON g.id = c.group_id WHERE g.name = 'billing' FOR UPDATE OF c"
        )

        def release() -> None:
            released.set()
            holder.commit()

        timer = threading.Timer(0.5, release)
        timer.start()
        started = time.monotonic()
        got = receive(api, max_messages=10)
        elapsed = time.monotonic() - started
        timer.join()
    assert released.is_set()
    assert elapsed >= 0.4, elapsed  # it did wait for the cursors
    bodies = {first["body"]} | {m["body"] for m in got}
    assert len(got) == 3
    assert bodies == {"m0", "m1", "m2", "m3"}
