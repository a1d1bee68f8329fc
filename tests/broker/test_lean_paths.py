"""The lean hot path (issue 10, docs/decisions/0025) answers exactly what the ORM and fresh DRF
serializers answered: plain-SQL loads equal ORM loads, shared output serializers render what a
new one renders, and a per-thread input serializer reused after a 400 validates like a new one."""

import threading
from typing import Any

import pytest
from rest_framework.exceptions import ValidationError
from rest_framework.test import APIClient

from apps.broker import rows, selectors
from apps.broker.api import output
from apps.broker.api import serializers as inputs
from apps.broker.api.views import validated
from apps.broker.models import (
    CommitLogEntry,
    ConsumerGroup,
    HalfMessage,
    ProducerGroup,
    Resolver,
    Topic,
)
from apps.broker.services import consuming
from tests.support.responses import expect


def _fields(instance: Any) -> dict[str, Any]:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


def _send_and_receive(api: APIClient) -> list[consuming.Received]:
    for n, body in enumerate(["text", None]):
        message: dict[str, Any] = {"body": body} if body else {"body_base64": "AAEC/w=="}
        expect(
            api.post(
                "/api/v1/topics/orders/messages",
                {
                    "producer_group": "order-service",
                    **message,
                    "tags": f"t{n}",
                    "keys": ["k1", "k2"],
                    "properties": {"p": "v", "é": "ü"},
                },
                format="json",
            ),
            201,
        )
    return consuming.message_receive(
        group=ConsumerGroup.objects.get(name="billing"),
        topic=Topic.objects.get(name="orders"),
        max_messages=10,
        invisible_seconds=30,
    )


@pytest.mark.django_db
def test_plain_sql_loads_equal_orm_loads(api: APIClient, setup_topic: Any) -> None:
    setup_topic()
    tid = expect(
        api.post(
            "/api/v1/transactions",
            {
                "producer_group": "order-service",
                "topic": "orders",
                "body": "x",
                "keys": ["a"],
                "properties": {"k": "v"},
                "check_immunity_seconds": 90,
                "delay_level": 2,
            },
            format="json",
        ),
        201,
    )["transaction_id"]
    half = HalfMessage.objects.get(transaction_id=tid)
    assert _fields(rows.one_by(HalfMessage, "transaction_id", half.transaction_id)) == _fields(half)
    for model, name in ((Topic, "orders"), (ProducerGroup, "order-service")):
        assert _fields(rows.one_by(model, "name", name)) == _fields(model.objects.get(name=name))
    assert _fields(selectors.consumer_group_get(name="billing")) == _fields(
        ConsumerGroup.objects.get(name="billing")
    )
    received = _send_and_receive(api)
    assert len(received) == 2
    for item in received:
        assert _fields(item.message) == _fields(CommitLogEntry.objects.get(pk=item.message.pk))
        stored = item.delivery.__class__.objects.get(pk=item.delivery.pk)
        assert _fields(item.delivery) == _fields(stored)


@pytest.mark.django_db
def test_shared_output_serializers_render_what_new_ones_render(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    received = _send_and_receive(api)
    assert output.render_many(output.ReceivedOut, received) == [
        dict(d) for d in output.ReceivedOut(received, many=True).data
    ]
    half = HalfMessage.objects.select_related("topic", "producer_group").first()
    if half is None:
        expect(
            api.post(
                "/api/v1/transactions",
                {"producer_group": "order-service", "topic": "orders", "body": "x"},
                format="json",
            ),
            201,
        )
        half = HalfMessage.objects.select_related("topic", "producer_group").get()
    assert output.render(output.PreparedOut, half) == dict(output.PreparedOut(half).data)


def test_a_reused_input_serializer_validates_like_a_new_one() -> None:
    cases: list[Any] = [
        {"producer_group": "g", "topic": "t", "body": "x"},
        {"producer_group": "g", "topic": "t", "body": 12},
        {"producer_group": "g", "topic": "t", "body": "x", "tagz": "a"},
        {"producer_group": "g", "topic": "t", "body_base64": "AA=="},
        [],
        None,
        {"producer_group": "g", "topic": "t", "body": "x", "delay_level": 3},
    ]

    def fresh(data: Any) -> Any:
        serializer = inputs.TransactionIn(data=data)
        if serializer.is_valid():
            return ("ok", dict(serializer.validated_data))
        return ("400", serializer.errors)

    def reused(data: Any) -> Any:
        try:
            return ("ok", validated(inputs.TransactionIn, data))
        except ValidationError as error:
            return ("400", error.detail)

    results: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(3):  # the same thread's serializer, after every kind of answer
                results.append([reused(data) == fresh(data) for data in cases])
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert results == [[True] * len(cases)] * 12


def _drf_rendered(serializer_class: type[output.CompiledOut], instance: Any) -> dict[str, Any]:
    """The reference: DRF's own Serializer.to_representation (a fresh serializer)."""
    serializer = serializer_class()
    serializer.use_drf = True
    return dict(serializer.to_representation(instance))


@pytest.mark.django_db
def test_compiled_output_serializers_render_what_drf_renders(
    api: APIClient, setup_topic: Any
) -> None:
    """Every hot output (prepare, commit with and without a delay, rollback, send, receive of
    text and bytes, the detail with its history) rendered by CompiledOut equals DRF's own
    rendering of the same object, None values and nested lists included."""
    from apps.broker.services import sending, transactions
    from apps.broker.services.transactions import Actor

    setup_topic()
    received = _send_and_receive(api)
    assert len(received) == 2
    for item in received:
        assert output.render(output.ReceivedOut, item) == _drf_rendered(output.ReceivedOut, item)
    ids = []
    for extra in ({}, {"delay_level": 2}, {"keys": ["k"], "tags": "t"}):
        answer = api.post(
            "/api/v1/transactions",
            {"producer_group": "order-service", "topic": "orders", "body": "x", **extra},
            format="json",
        )
        ids.append(expect(answer, 201)["transaction_id"])
    actor = Actor(source=Resolver.PRODUCER, name="t")
    resolutions = [
        transactions.transaction_commit(transaction_id=ids[0], actor=actor),
        transactions.transaction_commit(transaction_id=ids[1], actor=actor),  # delayed
        transactions.transaction_rollback(transaction_id=ids[2], actor=actor),
        transactions.transaction_commit(transaction_id=ids[0], actor=actor),  # again
    ]
    for resolution in resolutions:
        rendered = output.render(output.ResolutionOut, resolution)
        assert rendered == _drf_rendered(output.ResolutionOut, resolution)
    assert {
        r["resolved_by"] for r in map(lambda x: output.render(output.ResolutionOut, x), resolutions)
    } == {"PRODUCER"}
    for half in HalfMessage.objects.select_related("topic", "producer_group"):
        for cls in (output.PreparedOut, output.TransactionOut, output.TransactionDetailOut):
            assert output.render(cls, half) == _drf_rendered(cls, half)
    fresh = HalfMessage.objects.select_related("topic", "producer_group").get(transaction_id=ids[2])
    fresh.resolved_by = ""  # a SerializerMethodField answering None
    assert output.render(output.PreparedOut, fresh)["resolved_by"] is None
    assert output.render(output.PreparedOut, fresh) == _drf_rendered(output.PreparedOut, fresh)
    topic = Topic.objects.get(name="orders")
    message = sending.OutgoingMessage(
        producer_group="order-service", body=b"b", body_is_binary=False
    )
    for sent in sending.message_send_batch(topic=topic, messages=[(message, None)]):
        assert output.render(output.SendOut, sent) == _drf_rendered(output.SendOut, sent)
    as_mapping = {
        "msg_id": "M",
        "topic": {"name": "orders"},
        "queue_id": 1,
        "queue_offset": None,
        "deliver_at": None,
    }
    assert output.render(output.SendOut, as_mapping) == _drf_rendered(output.SendOut, as_mapping)


@pytest.mark.django_db
def test_one_statement_for_all_queues_takes_what_the_queue_by_queue_loop_takes(
    setup_topic: Any,
) -> None:
    """_entries_of_all (receives without a tag expression) against the per-queue loop it
    replaced, with a tag expression that keeps everything: same messages in the same order,
    same cursor moves, for queues of different lengths, cursors part way and every limit."""
    import random

    from apps.broker.models import ConsumerCursor
    from apps.broker.services import sending

    setup_topic(queues=4)
    topic = Topic.objects.get(name="orders")
    for n in range(80):
        message = sending.OutgoingMessage(
            producer_group="order-service", body=f"m{n}".encode(), body_is_binary=False, tags="t"
        )
        sending.message_send(topic=topic, message=message)
    group = ConsumerGroup.objects.get(name="billing")
    consuming._ensure_cursors(group, topic)
    rng = random.Random(7)
    for cursor in ConsumerCursor.objects.filter(group=group, topic=topic):
        cursor.next_offset = rng.randint(0, 12)
        cursor.save()
    cursors = list(
        ConsumerCursor.objects.filter(group=group, topic=topic)
        .order_by("queue_id")
        .values_list("id", "queue_id", "next_offset")
    )
    lengths = {q: CommitLogEntry.objects.filter(topic=topic, queue_id=q).count() for q in range(4)}
    available = sum(max(0, lengths[q] - offset) for _, q, offset in cursors)
    assert available > 32  # so the limits below are reached
    for order in range(5):
        shuffled = cursors[:]
        random.Random(order).shuffle(shuffled)
        for limit in (1, 3, 7, 16, 32):
            taken, moved = consuming._entries_of_all(topic, shuffled, limit)
            expected, expected_moved = consuming._entries_queue_by_queue(
                topic, shuffled, limit, frozenset({"t"})
            )
            assert [e.msg_id for e in taken] == [e.msg_id for e in expected]
            assert [_fields(e) for e in taken] == [_fields(e) for e in expected]
            assert moved == expected_moved
            assert len(taken) == limit
