"""The ordering check of the history checker (tests/chaos/ordering.py, issue 29) on histories
written by hand: each kind of violation is reported (a positive control) and the same history
without it is not (a negative control). No cluster: the commit log and the dead letters are
given as the database would answer them."""

from typing import Any

from tests.chaos.check import Report, unordered
from tests.chaos.history import History, Op
from tests.chaos.ordering import Logged

# Two message groups interleaved in queue 0: A at offsets 0, 2, 4 and B at 1, 3.
LOG = [
    Logged("A1", "A", 0, 0),
    Logged("B1", "B", 0, 1),
    Logged("A2", "A", 0, 2),
    Logged("B2", "B", 0, 3),
    Logged("A3", "A", 0, 4),
]


class Script:
    """A history at the times given (seconds on the clients' clock)."""

    def __init__(self) -> None:
        self.history = History()

    def _op(self, process: str, f: str, at: float, done: float, **kwargs: Any) -> Op:
        op = Op(len(self.history.ops), process, f, kwargs.pop("value", {}), at, **kwargs)
        op.completed = done
        self.history.ops.append(op)
        return op

    def receive(self, at: float, done: float, *msg_ids: str, attempt: int = 1) -> None:
        messages = [
            {
                "msg_id": msg_id,
                "body": msg_id,
                "queue_id": 0,
                "queue_offset": next(r.queue_offset for r in LOG if r.msg_id == msg_id),
                "delivery_attempt": attempt,
                "receipt_handle": f"{msg_id}.{attempt}",
            }
            for msg_id in msg_ids
        ]
        self._op("c0", "receive", at, done, type="ok", result={"body": {"messages": messages}})

    def ack(self, at: float, done: float, *handles: str, outcome: str = "ok") -> None:
        """outcome: "ok" (all acked), "invalid" (answered, none acked), "info" (unknown)."""
        body = {
            "acked": list(handles) if outcome == "ok" else [],
            "invalid": list(handles) if outcome == "invalid" else [],
        }
        result = {"body": body} if outcome != "info" else {"error": "ReadTimeout"}
        value = {"receipt_handles": list(handles), "retry_of": None}
        self._op("c0", "ack", at, done, type="ok" if outcome != "info" else "info", value=value)
        self.history.ops[-1].result = result

    def check(self, dead: set[str] | None = None) -> list[str]:
        return unordered(self.history, LOG, dead or set())


def in_order() -> Script:
    """Every message of both groups received and acked one at a time, in commit order."""
    s = Script()
    for n, msg_id in enumerate(["A1", "B1", "A2", "B2", "A3"]):
        s.receive(10 * n, 10 * n + 1, msg_id)
        s.ack(10 * n + 2, 10 * n + 3, f"{msg_id}.1")
    return s


def test_an_ordered_history_passes() -> None:
    assert in_order().check() == []


def test_first_receipts_out_of_commit_order_are_reported() -> None:
    s = Script()
    s.receive(0, 1, "A2")
    s.ack(2, 3, "A2.1")
    s.receive(4, 5, "A1")
    s.ack(6, 7, "A1.1")
    s.receive(8, 9, "A3")
    s.ack(10, 11, "A3.1")
    [found] = s.check()
    assert "A2" in found
    assert "before an earlier message's first receipt" in found


def test_a_receipt_while_an_earlier_message_is_unacked_is_reported() -> None:
    s = Script()
    s.receive(0, 1, "A1")
    s.receive(2, 3, "A2")  # A1 still in flight: the server must hold A2
    s.ack(4, 5, "A1.1", "A2.1")
    s.receive(6, 7, "A3")
    s.ack(8, 9, "A3.1")
    [found] = s.check()
    assert found.startswith("group A: A2")
    assert "while A1 was neither acked" in found


def test_a_receipt_answered_after_the_ack_was_sent_is_not_reported() -> None:
    """Not a certain violation: the ack (sent at 2) may have taken effect before the receive
    (answered at 3) was served."""
    s = Script()
    s.receive(0, 1, "A1")
    s.ack(2, 4, "A1.1")
    s.receive(1.5, 3, "A2")
    s.ack(5, 6, "A2.1")
    assert s.check() == []


def test_one_groups_unacked_head_does_not_concern_another_group() -> None:
    s = Script()
    s.receive(0, 1, "A1")
    s.receive(2, 3, "B1")  # A1 in flight: B is another group
    s.ack(4, 5, "A1.1", "B1.1")
    assert s.check() == []
    s.receive(3.5, 3.8, "B2")  # B1 in flight: B2 must wait, whatever A does
    [found] = s.check()
    assert found.startswith("group B: B2")
    assert "while B1 was neither acked" in found


def test_an_answer_the_ack_never_gave_counts_as_a_release_unless_redelivered() -> None:
    s = Script()
    s.receive(0, 1, "A1")
    s.ack(2, 30, "A1.1", outcome="info")  # it may have acked A1 from 2 on
    s.receive(3, 4, "A2")
    s.ack(5, 6, "A2.1")
    assert s.check() == []
    s.receive(40, 41, "A1", attempt=2)  # ... it had not: A1 comes back after A2 was handed out
    [found] = s.check()
    assert found.startswith("group A: A2")
    assert "an earlier message was received again" in found


def test_an_ack_answered_invalid_does_not_release() -> None:
    s = Script()
    s.receive(0, 1, "A1")
    s.ack(2, 3, "A1.1", outcome="invalid")
    s.receive(4, 5, "A2")
    [found] = s.check()
    assert "while A1 was neither acked" in found
    s.ack(1.5, 1.8, "A1.1")  # the same history with an ack that succeeded first
    assert s.check() == []


def test_a_head_redelivered_after_its_invisible_time_comes_first() -> None:
    s = Script()
    s.receive(0, 1, "A1")  # not acked: it comes back after its invisible time
    s.receive(11, 12, "A1", attempt=2)
    s.ack(13, 14, "A1.2")
    s.receive(15, 16, "A2")
    s.ack(17, 18, "A2.1")
    assert s.check() == []
    s.receive(5, 6, "A3")  # handed out while A1 waited for its redelivery (and A2 unreceived)
    found = s.check()
    assert any(item.startswith("group A: A3") for item in found), found


def test_a_dead_lettered_head_releases_the_next() -> None:
    s = Script()
    s.receive(0, 1, "A1")
    s.receive(11, 12, "A1", attempt=2)  # its last attempt: then dead-lettered, never acked
    s.receive(23, 24, "A2")
    s.ack(25, 26, "A2.1")
    assert s.check(dead={"A1"}) == []
    [found] = s.check()  # not dead-lettered, not acked: A1 still holds A2
    assert "while A1 was neither acked" in found


def test_a_message_received_before_the_last_attempt_of_a_dead_lettered_one_is_reported() -> None:
    s = Script()
    s.receive(0, 1, "A1")
    s.receive(5, 6, "A2")
    s.receive(11, 12, "A1", attempt=2)
    found = s.check(dead={"A1"})
    assert any(item.startswith("group A: A2") for item in found), found


def test_a_group_in_two_queues_is_reported() -> None:
    split = [*LOG, Logged("A4", "A", 1, 0)]
    s = in_order()
    assert unordered(s.history, LOG, set()) == []
    assert unordered(s.history, split, set()) == ["group A: in queues [0, 1], not one"]


def test_the_line_names_unordered_only_when_checked() -> None:
    assert "unordered" not in Report("F1").line()
    assert Report("F20", unordered=[]).line().endswith(" unordered=0")
    assert not Report("F20", unordered=["x"]).ok
