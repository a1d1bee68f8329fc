"""A SendMessage request is validated as a whole before anything of it is stored (CONTRACT
section 6, invariant 9), with raw stubs against the real server: a refused message anywhere in a
batch, normal or transactional, refuses the request with its code and stores nothing; a batch's
bodies are at most 4 MiB in all; keys are not blank, property names not empty, and neither gets
past the 16 KiB limit by being empty; a delivery time the protocol's Timestamp cannot hold is
ILLEGAL_DELIVERY_TIME; a batch mixing topics is MESSAGE_CORRUPTED, as RocketMQ's proxy answers.
Every refusal has a positive control: the request made good is stored."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from apps.broker.models import CommitLogEntry, DelayedMessage, HalfMessage
from apps.broker.services import registry
from tests.support.grpc import raw_message

pytestmark = pytest.mark.e2e

KiB = 1024
MiB = 1024 * KiB


def in_seconds(seconds: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(datetime.now(UTC) + timedelta(seconds=seconds))
    return stamp


def stored() -> tuple[int, int, int]:
    return (
        HalfMessage.objects.count(),
        CommitLogEntry.objects.count(),
        DelayedMessage.objects.count(),
    )


def send(door: Any, messages: list[Any]) -> Any:
    _, stub, meta = door
    return stub.SendMessage(rpc.SendMessageRequest(messages=messages), metadata=meta)


def assert_refused(answer: Any, code: int, before: tuple[int, int, int]) -> None:
    """Refused as a whole: the code in the status, no entry OK, nothing stored."""
    assert answer.status.code == code, answer.status
    assert all(entry.status.code == code for entry in answer.entries), answer.entries
    assert stored() == before


# A message the request refuses: (what, the change, its code, the same message made good).
REFUSED: list[tuple[str, dict[str, Any], int, dict[str, Any]]] = [
    ("an empty body", {"body": b""}, pb.MESSAGE_BODY_EMPTY, {"body": b"x"}),
    ("a blank key", {"system": {"keys": ["k", "  "]}}, pb.ILLEGAL_MESSAGE_KEY,
     {"system": {"keys": ["k", "j"]}}),
    ("an empty property name", {"properties": {"": "x"}}, pb.ILLEGAL_MESSAGE_PROPERTY_KEY,
     {"properties": {"p": "x"}}),
    ("a tag with a bar", {"system": {"tag": "a|b"}}, pb.ILLEGAL_MESSAGE_TAG,
     {"system": {"tag": "a"}}),
    ("a message id with a dash", {"system": {"message_id": "a-b"}}, pb.ILLEGAL_MESSAGE_ID, {}),
    # One topic per request (decision 0076): an unknown one beside known ones is a mix first.
    ("an unknown topic", {"topic": "nowhere"}, pb.MESSAGE_CORRUPTED, {}),
    ("a delivery time 400 days ahead", {"system": {"delivery_timestamp": in_seconds(400 * 86400)}},
     pb.ILLEGAL_DELIVERY_TIME, {"system": {"delivery_timestamp": in_seconds(60)}}),
    ("a delivery time in year 33658",
     {"system": {"delivery_timestamp": Timestamp(seconds=10**12)}},
     pb.ILLEGAL_DELIVERY_TIME, {"system": {"delivery_timestamp": in_seconds(60)}}),
]  # fmt: skip


@pytest.mark.parametrize("position", [0, 1, 2], ids=["first", "middle", "last"])
@pytest.mark.parametrize(
    ("change", "code", "good"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_a_refused_message_anywhere_in_a_batch_refuses_it_all(
    door: Any, position: int, change: dict[str, Any], code: int, good: dict[str, Any]
) -> None:
    setup = door[0]
    before = stored()
    batch = [raw_message(setup.topic) for _ in range(3)]
    batch[position] = raw_message(setup.topic, **change)
    assert_refused(send(door, batch), code, before)
    batch[position] = raw_message(setup.topic, **good)
    control = send(door, batch)
    assert control.status.code == pb.OK, control.status
    assert [entry.status.code for entry in control.entries] == [pb.OK] * 3
    assert sum(stored()) == sum(before) + 3


@pytest.mark.parametrize("position", [0, 2], ids=["first", "last"])
def test_a_refused_prepare_in_a_batch_refuses_it_all(door: Any, position: int) -> None:
    setup = door[0]
    transactional = {"message_type": pb.TRANSACTION}
    before = stored()
    batch = [raw_message(setup.topic, system=transactional) for _ in range(3)]
    batch[position] = raw_message(setup.topic, system={**transactional, "keys": [""]})
    assert_refused(send(door, batch), pb.ILLEGAL_MESSAGE_KEY, before)
    batch[position] = raw_message(setup.topic, system={**transactional, "keys": ["order-9527"]})
    control = send(door, batch)
    assert control.status.code == pb.OK, control.status
    assert stored() == (before[0] + 3, before[1], before[2])


@pytest.mark.parametrize("kind", [pb.NORMAL, pb.TRANSACTION], ids=["send", "prepare"])
@pytest.mark.parametrize("position", [1, 2], ids=["middle", "last"])
def test_a_batch_mixing_topics_is_refused_as_a_whole(door: Any, position: int, kind: int) -> None:
    """A request's messages are for one topic (decision 0076): one for another topic, which
    exists and takes the same messages alone, refuses the request, named, and stores nothing; a
    request all for one unknown topic is still TOPIC_NOT_FOUND."""
    setup = door[0]
    other = registry.topic_create(name=f"{setup.topic}-other", queues=4).name
    system = {"message_type": kind}
    before = stored()
    batch = [raw_message(setup.topic, system=system) for _ in range(3)]
    batch[position] = raw_message(other, system=system)
    answer = send(door, batch)
    assert_refused(answer, pb.MESSAGE_CORRUPTED, before)
    assert answer.status.message == (
        f"Message {position + 1} of 3: Its topic is {other!r}, the first message's "
        f"{setup.topic!r}: a batch's messages are for one topic."
    )
    # The positive controls: the same batch on one topic, either of the two, is stored.
    for topic in (setup.topic, other):
        batch = [raw_message(topic, system=system) for _ in range(3)]
        control = send(door, batch)
        assert control.status.code == pb.OK, control.status
        assert [entry.status.code for entry in control.entries] == [pb.OK] * 3
    assert sum(stored()) == sum(before) + 6
    # One topic, unknown: its own code, not the mix's.
    after = stored()
    assert_refused(
        send(door, [raw_message("nowhere") for _ in range(3)]), pb.TOPIC_NOT_FOUND, after
    )


def test_a_conflict_met_while_storing_a_batch_leaves_none_of_it_stored(door: Any) -> None:
    """Checked whole, the batch is stored whole too: the second message's id, in use by the
    first as a normal message, refuses the request and takes the first one back with it."""
    setup = door[0]
    before = stored()
    first = raw_message(setup.topic, system={"message_id": "AB"})
    batch = [
        first,
        raw_message(setup.topic, system={"message_id": "AB", "message_type": pb.TRANSACTION}),
    ]
    answer = send(door, batch)
    assert_refused(answer, pb.BAD_REQUEST, before)
    assert "in use" in answer.status.message
    batch[1] = raw_message(setup.topic, system={"message_id": "CD", "message_type": pb.TRANSACTION})
    control = send(door, batch)
    assert control.status.code == pb.OK, control.status
    assert stored() == (before[0] + 1, before[1] + 1, before[2])


def test_a_batch_over_4_mib_in_all_is_refused_and_stores_nothing(door: Any) -> None:
    setup = door[0]
    before = stored()
    # One byte over, split so that neither body is over alone: the door's own sum is tested.
    large = [raw_message(setup.topic, body=b"x" * (2 * MiB + extra)) for extra in (0, 1)]
    assert_refused(send(door, large), pb.MESSAGE_BODY_TOO_LARGE, before)
    # The positive control: 4 MiB in all, exactly.
    control = send(door, [raw_message(setup.topic, body=b"x" * (2 * MiB)) for _ in range(2)])
    assert control.status.code == pb.OK, control.status
    assert stored() == (before[0], before[1] + 2, before[2])


# Keys and property names, alone in a request: (what, the change, its code).
META: list[tuple[str, dict[str, Any], int]] = [
    ("an empty and a blank key", {"system": {"keys": ["", "   "]}}, pb.ILLEGAL_MESSAGE_KEY),
    ("a tab as a key", {"system": {"keys": ["\t"]}}, pb.ILLEGAL_MESSAGE_KEY),
    ("NUL in a key", {"system": {"keys": ["k\x00"]}}, pb.ILLEGAL_MESSAGE_KEY),
    ("an empty property name", {"properties": {"": "x"}}, pb.ILLEGAL_MESSAGE_PROPERTY_KEY),
    ("NUL in a property name", {"properties": {"p\x00": "x"}}, pb.ILLEGAL_MESSAGE_PROPERTY_KEY),
    ("200,000 empty keys", {"system": {"keys": [""] * 200_000}},
     pb.MESSAGE_PROPERTIES_TOO_LARGE),
    ("16,385 one-byte keys", {"system": {"keys": ["k"] * (16 * KiB + 1)}},
     pb.MESSAGE_PROPERTIES_TOO_LARGE),
]  # fmt: skip


@pytest.mark.parametrize("kind", [pb.NORMAL, pb.TRANSACTION], ids=["send", "prepare"])
@pytest.mark.parametrize(("change", "code"), [m[1:] for m in META], ids=[m[0] for m in META])
def test_blank_keys_and_empty_property_names_are_refused(
    door: Any, kind: int, change: dict[str, Any], code: int
) -> None:
    setup = door[0]
    before = stored()
    system = {**change.get("system", {}), "message_type": kind}
    properties = change.get("properties", {})
    refused = raw_message(setup.topic, system=system, properties=properties)
    assert_refused(send(door, [refused]), code, before)
    # The positive control: 16 KiB of one-byte keys, and a named property.
    system = {"keys": ["k"] * (16 * KiB - 2), "message_type": kind}
    control = send(door, [raw_message(setup.topic, system=system, properties={"p": ""})])
    assert control.status.code == pb.OK, control.status
    assert sum(stored()) == sum(before) + 1


# Delivery times no datetime can hold, or no Timestamp: (what, seconds, nanos); seconds None: a
# minute from now, so that only the nanos are wrong.
OUT_OF_RANGE: list[tuple[str, int | None, int]] = [
    ("10**12 seconds", 10**12, 0),
    ("-10**12 seconds", -(10**12), 0),
    ("just after 9999-12-31", 253402300800, 0),
    ("just before 0001-01-01", -62135596801, 0),
    ("the largest int64", 2**63 - 1, 0),
    ("negative nanos", None, -1),
    ("a second of nanos", None, 10**9),
    ("the largest int32 of nanos", None, 2**31 - 1),
]


@pytest.mark.parametrize(
    ("seconds", "nanos"), [o[1:] for o in OUT_OF_RANGE], ids=[o[0] for o in OUT_OF_RANGE]
)
def test_a_delivery_time_out_of_range_is_illegal_and_stores_nothing(
    door: Any, seconds: int | None, nanos: int
) -> None:
    setup = door[0]
    before = stored()
    stamp = Timestamp(seconds=in_seconds(60).seconds if seconds is None else seconds, nanos=nanos)
    refused = raw_message(setup.topic, system={"delivery_timestamp": stamp})
    assert_refused(send(door, [refused]), pb.ILLEGAL_DELIVERY_TIME, before)
    # The positive control: a minute ahead, with its nanos, waits for its time.
    stamp = in_seconds(60)
    stamp.nanos = 999_999_999
    control = send(door, [raw_message(setup.topic, system={"delivery_timestamp": stamp})])
    assert control.status.code == pb.OK, control.status
    assert stored() == (before[0], before[1], before[2] + 1)
