"""One client-chosen message id is stored once, however many sends and prepares race for it
(docs/decisions/0040; CONTRACT invariants 4 and 8, section 7): two threads that both found the id
free are held in the window between that check and their insert (the failpoint
after_msg_id_check), then both store. Afterwards exactly one table holds the id; the loser is
answered as decision 0040 says, the winner's answer for its own group's retry, its scoped id for
another group, and what each stored is delivered."""

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from apps.broker import failpoints
from apps.broker.models import (
    CommitLogEntry,
    DelayedMessage,
    HalfMessage,
    RecalledMessage,
    Topic,
)
from apps.broker.services import delivery, registry, transactions
from apps.broker.services.client_ids import scoped_id
from apps.broker.services.sending import OutgoingMessage, Sent, message_send
from tests.support.transactions import PRODUCER, make_group

ROUNDS = 3
TABLES = (CommitLogEntry, DelayedMessage, HalfMessage, RecalledMessage)


class Window:
    """The window between a client id's check and its insert (the failpoint site
    after_msg_id_check): each racer's first pass waits there until every racer has checked, so
    all of them found the id free before any stores it. A racer's retry passes at once."""

    def __init__(self) -> None:
        self.open(1)

    def open(self, racers: int) -> None:
        self.barrier = threading.Barrier(racers, timeout=20)
        self.passed: set[int] = set()

    def wait(self) -> None:
        if threading.get_ident() in self.passed:
            return
        self.passed.add(threading.get_ident())
        self.barrier.wait()  # a racer that never comes breaks it: the test fails, not passes


@pytest.fixture
def window() -> Iterator[Window]:
    held_open = Window()
    with failpoints.armed_here("after_msg_id_check", held_open.wait):
        yield held_open


def race(window: Window, *works: Callable[[], Any]) -> list[Any]:
    """Runs `works` in threads of their own (each its own connection), released together and held
    in the window until all have checked; their results in order. An exception in a thread is
    raised here by `result()`."""
    window.open(len(works))
    barrier = threading.Barrier(len(works))

    def run(work: Callable[[], Any]) -> Any:
        try:
            barrier.wait(timeout=30)
            return work()
        finally:
            connection.close()

    with ThreadPoolExecutor(len(works)) as pool:
        futures = [pool.submit(run, work) for work in works]
        return [future.result(timeout=60) for future in futures]


def message(group: str, body: str) -> OutgoingMessage:
    return OutgoingMessage(producer_group=group, body=body.encode(), body_is_binary=False)


def send(topic: Topic, group: str, msg_id: str, deliver_at: datetime | None) -> Sent:
    return message_send(
        topic=topic, message=message(group, "order 9527"), deliver_at=deliver_at, msg_id=msg_id
    )


def holders(msg_id: str) -> list[str]:
    """The tables with a row under `msg_id`, once per row."""
    return [
        model._meta.db_table
        for model in TABLES
        for _ in model.objects.filter(msg_id=msg_id).values_list("pk", flat=True)
    ]


def deliver_everything_delayed() -> int:
    DelayedMessage.objects.update(deliver_at=timezone.now() - timedelta(seconds=1))
    return delivery.delayed_deliver_due()


def test_a_delayed_and_an_immediate_send_of_one_client_id_store_it_once(
    transactional_db: None, window: Window
) -> None:
    """The same group sends one id twice at once (a client's retry on another connection), once
    with a delivery time and once without: one message is stored, and both sends answer it."""
    topic = registry.topic_create(name="orders", queues=2)
    group = make_group(name="shop")
    later = timezone.now() + timedelta(hours=1)
    ids = [f"01C0FFEE{round_no:024X}" for round_no in range(ROUNDS)]
    for msg_id in ids:
        delayed, immediate = race(
            window,
            partial(send, topic, group.name, msg_id, later),
            partial(send, topic, group.name, msg_id, None),
        )
        assert len(holders(msg_id)) == 1, holders(msg_id)
        assert delayed == immediate  # the loser answers what the winner stored
        assert delayed.msg_id == msg_id
    # What was stored is delivered, the delayed ones too (their ids are theirs alone).
    waiting = DelayedMessage.objects.count()
    assert deliver_everything_delayed() == waiting
    assert sorted(CommitLogEntry.objects.values_list("msg_id", flat=True)) == sorted(ids)


def test_a_prepare_and_another_groups_send_of_one_client_id_each_store_under_their_own(
    transactional_db: None, window: Window
) -> None:
    """Group A prepares and group B sends with one client id at once: the id goes to one of them,
    the other's message is stored under its group's scoped id, and A's commit succeeds."""
    topic = registry.topic_create(name="orders", queues=2)
    group_a, group_b = make_group(name="shop-a"), make_group(name="shop-b")
    for round_no in range(ROUNDS):
        msg_id = f"01BEEF{round_no:026X}"

        def prepare(msg_id: str = msg_id) -> HalfMessage:
            return transactions.transaction_prepare(
                producer_group=group_a,
                topic=topic,
                message=message(group_a.name, "A's order"),
                actor=PRODUCER,
                msg_id=msg_id,
            )

        half, sent = race(window, prepare, partial(send, topic, group_b.name, msg_id, None))
        assert isinstance(half, HalfMessage)
        assert isinstance(sent, Sent)
        answered = {half.msg_id, sent.msg_id}
        scoped = {
            scoped_id(client_id=msg_id, producer_group=group.name) for group in (group_a, group_b)
        }
        assert len(answered) == 2, answered
        assert msg_id in answered
        assert answered - {msg_id} <= scoped
        assert holders(half.msg_id) == ["broker_halfmessage"]
        assert holders(sent.msg_id) == ["broker_commitlogentry"]

        resolution = transactions.transaction_commit(
            transaction_id=half.transaction_id, actor=PRODUCER
        )
        assert resolution.entry is not None
        assert resolution.entry.msg_id == half.msg_id
        assert sorted(holders(half.msg_id)) == ["broker_commitlogentry", "broker_halfmessage"]


def test_the_window_is_open_without_a_race(transactional_db: None, window: Window) -> None:
    """The positive control: a lone send through the armed window stores its id as sent."""
    topic = registry.topic_create(name="orders", queues=1)
    group = make_group(name="shop")
    [sent] = race(window, lambda: send(topic, group.name, "01ALONE", None))
    assert sent.msg_id == "01ALONE"
    assert holders("01ALONE") == ["broker_commitlogentry"]
