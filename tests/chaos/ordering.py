"""The ordering check of a FIFO consumer group's history (issue 29, decision 0054): per message
group, in commit-log order (the queue offset in the group's queue),

- first receipts in commit order: no message's first receipt before an earlier one's;
- no receipt of a later message of the group before every earlier one was released (acked, or
  dead-lettered);
- no earlier message received again after a later one was handed out (it was not released then).

Times are the clients' (time.monotonic() of one process), and only a certain violation counts:
a receipt is certainly before a release when its answer came before the releasing ack was even
sent. An ack whose outcome is unknown may have released the message from its sending on; a
dead-lettered message is released no earlier than its last receipt (the dead-letter step comes
after it); one dead-lettered without a receipt in the history (its answer was lost) has no
bound. A receipt whose answer the client never saw is not in the history at all."""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

NEVER = float("inf")


@dataclass(frozen=True)
class Receipt:
    """One message handed out to a consumer: when its receive was sent and answered."""

    msg_id: str
    handle: str
    invoked: float
    completed: float


@dataclass(frozen=True)
class Ack:
    """An ack request: the handles it may have acked (all of them when its outcome is unknown,
    those it answered `acked` when it succeeded) and when it was sent."""

    handles: tuple[str, ...]
    invoked: float


@dataclass(frozen=True)
class Logged:
    """A commit-log row with a message group."""

    msg_id: str
    message_group: str
    queue_id: int
    queue_offset: int


def unordered(
    log: Iterable[Logged], receipts: Iterable[Receipt], acks: Iterable[Ack], dead: set[str]
) -> list[str]:
    """The ordering violations, one line each; `dead` are the msg_ids the group dead-lettered."""
    by_msg: dict[str, list[Receipt]] = defaultdict(list)
    msg_of: dict[str, str] = {}
    for receipt in receipts:
        by_msg[receipt.msg_id].append(receipt)
        msg_of[receipt.handle] = receipt.msg_id
    released = _releases(by_msg, msg_of, acks, dead)
    groups: dict[str, list[Logged]] = defaultdict(list)
    for row in log:
        groups[row.message_group].append(row)
    found: list[str] = []
    for group, rows in sorted(groups.items()):
        queues = {row.queue_id for row in rows}
        if len(queues) > 1:
            found.append(f"group {group}: in queues {sorted(queues)}, not one")
            continue
        found += _group_violations(
            group, sorted(rows, key=lambda r: r.queue_offset), by_msg, released
        )
    return found


def _releases(
    by_msg: dict[str, list[Receipt]], msg_of: dict[str, str], acks: Iterable[Ack], dead: set[str]
) -> dict[str, float]:
    """msg_id -> the earliest time it may have been released (NEVER if it was not)."""
    released: dict[str, float] = {}
    for ack in acks:
        for handle in ack.handles:
            msg_id = msg_of.get(handle)
            if msg_id is not None:
                released[msg_id] = min(released.get(msg_id, NEVER), ack.invoked)
    for msg_id in dead:
        last = max((r.invoked for r in by_msg.get(msg_id, [])), default=0.0)
        released[msg_id] = min(released.get(msg_id, NEVER), last)
    return released


def _group_violations(
    group: str, rows: list[Logged], by_msg: dict[str, list[Receipt]], released: dict[str, float]
) -> list[str]:
    found = []
    earlier_first = 0.0  # the latest first receipt (sent) of the earlier messages
    earlier_release = 0.0  # the latest release of the earlier messages
    blocker = ""  # the earlier message released last
    earlier_again = 0.0  # the latest receipt (sent) of any earlier message
    for row in rows:
        mine = by_msg.get(row.msg_id, [])
        at = f"group {group}: {row.msg_id} (q{row.queue_id}@{row.queue_offset})"
        if mine:
            answered = min(r.completed for r in mine)
            first = min(mine, key=lambda r: r.invoked)
            if answered < earlier_first:
                found.append(f"{at} first received before an earlier message's first receipt")
            elif answered < earlier_release:
                found.append(f"{at} received while {blocker} was neither acked nor dead-lettered")
            elif answered < earlier_again:
                found.append(f"{at} received, then an earlier message was received again")
            earlier_first = max(earlier_first, first.invoked)
            earlier_again = max(earlier_again, max(r.invoked for r in mine))
        release = released.get(row.msg_id, NEVER)
        if release > earlier_release:
            earlier_release, blocker = release, row.msg_id
    return found
