"""The wake-up hub's "known empty" notes (apps/broker/wakeups.py, docs/decisions/0026): a receive
may skip its try only while nothing could have changed the answer as far as this process can
tell. Each way the answer can change ends the note."""

import dataclasses
import time

from django.test.utils import override_settings

from apps.broker import tag_wakeups
from apps.broker.wakeups import Hub

TOPIC, GROUP, OTHER_GROUP = 7, 3, 4


def listening_hub() -> Hub:
    hub = Hub()
    hub.listening = True  # as after its LISTEN (the e2e tests run the real connection)
    return hub


def test_a_try_that_found_nothing_is_remembered_for_its_pair_only() -> None:
    hub = listening_hub()
    hub.note_empty(TOPIC, GROUP, hub.mark(TOPIC))
    assert hub.known_empty(TOPIC, GROUP)
    assert not hub.known_empty(TOPIC, OTHER_GROUP)
    assert not hub.known_empty(TOPIC + 1, GROUP)


def test_a_wake_up_for_the_topic_since_the_mark_ends_it() -> None:
    hub = listening_hub()
    mark = hub.mark(TOPIC)
    hub.wake(TOPIC, 1)  # a NOTIFY that arrived while the try ran
    hub.note_empty(TOPIC, GROUP, mark)
    assert not hub.known_empty(TOPIC, GROUP)
    hub.note_empty(TOPIC, GROUP, hub.mark(TOPIC))
    assert hub.known_empty(TOPIC, GROUP)
    hub.wake(TOPIC, 1)  # one after the note
    assert not hub.known_empty(TOPIC, GROUP)


def test_a_try_made_while_the_hub_did_not_listen_is_not_remembered() -> None:
    hub = Hub()  # not listening: a NOTIFY could be missed
    hub.note_empty(TOPIC, GROUP, hub.mark(TOPIC))
    hub.listening = True
    assert not hub.known_empty(TOPIC, GROUP)


def test_a_gap_in_listening_ends_every_note() -> None:
    hub = listening_hub()
    mark = hub.mark(TOPIC)
    hub.note_empty(TOPIC, GROUP, mark)
    hub.generation += 1  # what _listen_forever does when its connection fails
    assert not hub.known_empty(TOPIC, GROUP)
    hub.note_empty(TOPIC, GROUP, mark)  # a try that began before the gap
    assert not hub.known_empty(TOPIC, GROUP)
    hub.listening = False
    hub.note_empty(TOPIC, GROUP, hub.mark(TOPIC))
    assert not hub.known_empty(TOPIC, GROUP)


@override_settings(TXHUB_LONG_POLL_FALLBACK=0.1)
def test_a_note_lasts_two_fallback_periods() -> None:
    hub = listening_hub()
    hub.note_empty(TOPIC, GROUP, hub.mark(TOPIC))
    assert hub.known_empty(TOPIC, GROUP)
    time.sleep(0.25)
    assert not hub.known_empty(TOPIC, GROUP)


def test_a_batch_wakes_as_many_waiters_as_it_takes_to_receive_it() -> None:
    # On an event loop, as in a web process (the hub's LISTEN task starts, and is cancelled when
    # the loop ends: every event below is set before it runs at all).
    import asyncio

    async def scenario() -> list[bool]:
        hub = Hub()
        waiters = [hub.register(TOPIC, GROUP, wants=32) for _ in range(10)]
        others = [hub.register(TOPIC, OTHER_GROUP) for _ in range(3)]
        hub.wake(TOPIC, 64)  # a batch of 64 announced
        hub.wake(TOPIC, 1)  # and one more message
        return [w.event.is_set() for w in waiters] + [w.event.is_set() for w in others]

    woken = asyncio.run(scenario())
    # Group 3: two receives of 32 for the batch, a third for the single message; group 4 (one
    # message each try): three of its three.
    assert woken == [True, True, True] + [False] * 7 + [True, True, True]


def test_a_note_is_for_the_tag_filter_of_the_try_that_found_nothing() -> None:
    # Decision 0081: a filter that takes nothing there says nothing about another filter.
    hub = listening_hub()
    hub.note_empty(TOPIC, GROUP, hub.mark(TOPIC), frozenset({"Nope"}))
    assert hub.known_empty(TOPIC, GROUP, frozenset({"Nope"}))
    assert not hub.known_empty(TOPIC, GROUP)
    assert not hub.known_empty(TOPIC, GROUP, frozenset({"TagA"}))


def test_expired_messages_of_a_tag_wake_only_the_waiters_whose_filter_takes_them() -> None:
    # Decision 0081: the fallback check counts expired deliveries per tag; a waiter whose filter
    # takes none of them is not woken (it would take nothing, every second, for ever).
    import asyncio

    async def scenario() -> list[bool]:
        hub = Hub()
        nope = [hub.register(TOPIC, GROUP, tags=frozenset({"Nope"})) for _ in range(3)]
        matching = [hub.register(TOPIC, GROUP, tags=frozenset({"TagB", "TagA"})) for _ in range(2)]
        everything = hub.register(TOPIC, GROUP)
        other_group = hub.register(TOPIC, OTHER_GROUP)
        # 40 expired messages nobody here but the waiter without a filter takes, and one that
        # the matching waiters take, in this group only.
        hub.wake_tagged(TOPIC, GROUP, {"TagC": 40, "TagA": 1})
        return [w.event.is_set() for w in [*nope, *matching, everything, other_group]]

    woken = asyncio.run(scenario())
    assert woken == [False, False, False, True, False, True, False]


def test_the_tags_a_waiter_takes_count_up_to_its_batch() -> None:
    # tag_wakeups.to_wake: a waiter takes up to `wants` messages of the tags its filter takes;
    # the next waiter is woken only for what is left.
    @dataclasses.dataclass(frozen=True)
    class Waiting:
        name: str
        tags: frozenset[str] | None
        wants: int

    a_or_b = frozenset({"A", "B"})
    waiters = [
        Waiting("c only", frozenset({"C"}), 32),
        Waiting("a or b, 2", a_or_b, 2),
        Waiting("a or b, 32", a_or_b, 32),
        Waiting("a or b, again", a_or_b, 32),
        Waiting("any", None, 1),
        Waiting("any, again", None, 1),
    ]
    woken = tag_wakeups.to_wake(waiters, {"A": 1, "B": 3, "D": 1})
    # A and B: 4 messages, two waiters of A || B (2 + 32); D: one waiter without a filter.
    assert [w.name for w in woken] == ["a or b, 2", "a or b, 32", "any"]
    assert tag_wakeups.to_wake(waiters, {"E": 0}) == []
    many = {f"T{i}": 1 for i in range(5000)}  # a client's many tags: one pass all the same
    assert [w.name for w in tag_wakeups.to_wake(waiters, many)] == ["any", "any, again"]
