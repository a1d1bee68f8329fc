"""The wake-up hub's "known empty" notes (apps/broker/wakeups.py, docs/decisions/0026): a receive
may skip its try only while nothing could have changed the answer as far as this process can
tell. Each way the answer can change ends the note."""

import time

from django.test.utils import override_settings

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
