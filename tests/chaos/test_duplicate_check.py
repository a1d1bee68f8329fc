"""The duplicate check of the history checker (`duplicated=`) on histories written by hand: a
message received again after its ack succeeded is reported (positive controls), and a message
whose receive a crash undid is not, although its ack's retry was answered "invalid" (the F7 run
that found it: the receive's commit was lost with Postgres, so no delivery of the handle existed).
No cluster: the deliveries are read from the history as `check` reads them."""

from typing import Any

from tests.chaos.check import deliveries, duplicates
from tests.chaos.history import History, Op


class Script:
    """A history of one consumer at the times given (seconds on the client's clock)."""

    def __init__(self) -> None:
        self.history = History()

    def _op(self, f: str, at: float, done: float, type_: str, value: Any, result: Any) -> Op:
        op = Op(len(self.history.ops), "c0", f, value, at, type_, done, result)
        self.history.ops.append(op)
        return op

    def receive(self, at: float, msg_id: str, attempt: int, handle: str) -> None:
        message = {
            "msg_id": msg_id,
            "body": msg_id,
            "queue_id": 0,
            "queue_offset": 0,
            "delivery_attempt": attempt,
            "receipt_handle": handle,
        }
        self._op("receive", at, at + 0.01, "ok", {}, {"body": {"messages": [message]}})

    def ack(self, at: float, handle: str, outcome: str, retry_of: Op | None = None) -> Op:
        """outcome: "acked", "invalid" (both answered 200) or "lost" (503, then no answer)."""
        value = {"receipt_handles": [handle], "retry_of": retry_of.index if retry_of else None}
        if outcome == "lost":
            return self._op("ack", at, at + 0.05, "info", value, {"status": 503})
        body = {"acked": [handle] if outcome == "acked" else [], "invalid": []}
        if outcome == "invalid":
            body["invalid"] = [handle]
        return self._op("ack", at, at + 0.05, "ok", value, {"status": 200, "body": body})

    def duplicated(self) -> list[str]:
        return duplicates(self.history, deliveries(self.history))


def test_a_message_received_again_after_its_ack_succeeded_is_a_duplicate() -> None:
    script = Script()
    script.receive(0, "M", 1, "h1")
    script.ack(0.1, "h1", "acked")
    script.receive(12, "M", 2, "h2")
    assert script.duplicated() == ["M"]


def test_an_ack_whose_answer_was_lost_and_whose_retry_finds_no_handle_counts_as_acked() -> None:
    """The server still knew the receive (the message comes back as attempt 2): the lost ack
    landed, and the message's return is a duplicate."""
    script = Script()
    script.receive(0, "M", 1, "h1")
    lost = script.ack(0.1, "h1", "lost")
    script.ack(5, "h1", "invalid", retry_of=lost)
    script.receive(12, "M", 2, "h2")
    assert script.duplicated() == ["M"]


def test_a_receive_undone_by_a_crash_makes_its_handle_invalid_not_acked() -> None:
    """Postgres lost the receive's commit: the retried ack finds no such delivery, and the
    message comes back as attempt 1, which is its first delivery the server knows of."""
    script = Script()
    script.receive(0, "M", 1, "h1")
    lost = script.ack(0.1, "h1", "lost")
    script.ack(5, "h1", "invalid", retry_of=lost)
    script.receive(6, "M", 1, "h2")
    script.ack(6.1, "h2", "acked")
    assert script.duplicated() == []


def test_an_ack_that_succeeded_before_a_crash_still_makes_a_return_a_duplicate() -> None:
    """An explicit ack is believed whatever came after: a message back after it, even as attempt
    1, is a duplicate."""
    script = Script()
    script.receive(0, "M", 1, "h1")
    script.ack(0.1, "h1", "acked")
    script.receive(6, "M", 1, "h2")
    assert script.duplicated() == ["M"]
