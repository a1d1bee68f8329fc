"""The checker: reads a whole history and the database after drain, and counts violations of the
contract, adapted from Jepsen's total-queue and Kafka checkers:

- lost: a send answered ok, or a transaction whose outcome is COMMIT (the producer's commit, or
  check-back answered COMMIT) that was prepared ok, never received;
- unexpected: received although never committed (rolled back, left UNKNOWN, a refused send or
  prepare), or a body no client ever sent;
- duplicated: a message received again by the group after an ack of it had succeeded;
- skipped: a consumer saw a queue's offset n+2 before n+1 (first deliveries out of order for
  one consumer), or the offsets received from a queue are not exactly the dense offsets of the
  commit log;
- conflicting: more than one final op, a state that disagrees with its final op, a commit-log
  row count that disagrees with the state, or a client answer that disagrees with the database;
- unordered (a FIFO consumer group's history only): tests/chaos/ordering.py.
"""

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.chaos import ordering
from tests.chaos.history import History, Op
from tests.chaos.workload import intent_of


@dataclass
class Report:
    fault: str
    ops: int = 0
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    conflicting: list[str] = field(default_factory=list)
    unordered: list[str] | None = None  # checked for a FIFO consumer group only
    unavailable: float = 0.0
    malformed: list[str] = field(default_factory=list)  # an error not in the contract's format
    violations: list[str] = field(default_factory=list)  # the fault case's own expectations
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.unexpected
            or self.duplicated
            or self.skipped
            or self.conflicting
            or self.unordered
            or self.malformed
            or self.violations
        )

    def line(self) -> str:
        return (
            f"chaos: {self.fault} ops={self.ops} lost={len(self.lost)} "
            f"unexpected={len(self.unexpected)} duplicated={len(self.duplicated)} "
            f"skipped={len(self.skipped)} conflicting={len(self.conflicting)} "
            f"unavailable={self.unavailable:.1f}s"
            + ("" if self.unordered is None else f" unordered={len(self.unordered)}")
        )

    def details(self, limit: int = 10) -> str:
        parts = []
        names = ("lost", "unexpected", "duplicated", "skipped", "conflicting", "unordered")
        for name in (*names, "malformed", "violations"):
            items = getattr(self, name)
            if items:
                parts.append(f"  {name}: {items[:limit]}")
        return "\n".join(parts + [f"  note: {n}" for n in self.notes])


@dataclass(frozen=True)
class Delivery:
    process: str
    invoked: float
    msg_id: str
    body: str
    queue_id: int
    queue_offset: int
    attempt: int
    handle: str
    completed: float = 0.0  # when the receive was answered


def expectations(history: History) -> tuple[set[str], set[str]]:
    """(bodies that must be received, bodies that must never be). A body may have been sent more
    than once (retries with its Idempotency-Key): one ok attempt means stored; only attempts that
    all failed mean never stored."""
    outcomes: dict[str, set[str]] = defaultdict(set)
    for op in history.of("send", "prepare"):
        outcomes[op.value["body"]].add(op.type)
    must, must_not = set(), set()
    for body, types in outcomes.items():
        intent, _ = intent_of(body)
        if types == {"fail"} or intent in {"ROLLBACK", "UNKNOWN"}:
            must_not.add(body)
        elif "ok" in types:
            must.add(body)  # a send answered ok, or a transaction whose outcome is COMMIT
    return must, must_not


def deliveries(history: History) -> list[Delivery]:
    found = []
    for op in history.of("receive"):
        if op.type != "ok":
            continue
        for m in op.result["body"]["messages"]:
            found.append(
                Delivery(
                    op.process,
                    op.invoked,
                    m["msg_id"],
                    m["body"],
                    m["queue_id"],
                    m["queue_offset"],
                    m["delivery_attempt"],
                    m["receipt_handle"],
                    op.completed or op.invoked,
                )
            )
    return found


def check(
    fault: str, topic: str, history: History, sql: Any, *, fifo_group: str | None = None
) -> Report:
    """`sql(query) -> rows` reads the cluster's database after drain. `fifo_group`: the FIFO
    consumer group whose history it is (adds the ordering check)."""
    report = Report(fault, ops=sum(1 for op in history.ops if op.f != "receive"))
    must, must_not = expectations(history)
    received = deliveries(history)
    bodies = {d.body for d in received}
    sent = {op.value["body"] for op in history.of("send", "prepare")}
    report.lost = sorted(must - bodies)
    report.unexpected = sorted((bodies & must_not) | (bodies - sent))
    report.duplicated = duplicates(history, received)
    log = _grouped_log(topic, sql) if fifo_group else []
    report.skipped = _skips(received, topic, sql, {row.msg_id: row.message_group for row in log})
    if fifo_group:
        report.unordered = unordered(history, log, _dead_letters(fifo_group, sql))
    undone = _receives_undone(received)
    if undone:
        report.notes.append(f"{undone} receives undone by a crash or failover (redelivered)")
    report.conflicting = _conflicts(history, topic, sql)
    report.unavailable = _unavailable(history)
    report.malformed = _malformed(history)
    return report


def _malformed(history: History) -> list[str]:
    """Every error answer is the contract's JSON envelope, whatever failed (never HTML)."""
    found = []
    for op in history.ops:
        status = op.result.get("status")
        if status is None or status < 400:
            continue
        body = op.result.get("body")
        error = body.get("error") if isinstance(body, dict) else None
        if not (isinstance(error, dict) and {"code", "message", "details"} <= set(error)):
            found.append(f"{op.f} answered {status}: {op.result.get('raw', body)!r:.120}")
    return found


def duplicates(history: History, received: list[Delivery]) -> list[str]:
    acked_at: dict[str, float] = {}  # receipt handle -> when its ack was answered ok
    acks = history.of("ack")
    for op in acks:
        if op.type == "ok" and op.completed is not None:
            for handle in op.result["body"]["acked"]:
                acked_at[handle] = op.completed
    received_at = {d.handle: d.invoked for d in received}
    forgotten = _forgotten(received)
    for retry in acks:
        first = retry.value.get("retry_of")
        if first is None or retry.type != "ok" or retry.completed is None:
            continue
        # A handle the retry calls invalid although still inside its invisible time (10 s) was
        # acked by the attempt whose answer was lost: it counts as acked from that attempt on.
        # Unless a crash undid the receive that gave it out (the message came again with no
        # higher attempt): then the handle is invalid because no delivery of it exists.
        for handle in retry.result["body"]["invalid"]:
            if handle in forgotten:
                continue
            if retry.completed < received_at.get(handle, 0) + 9:
                acked_at[handle] = min(acked_at.get(handle, 1e18), _done(history.ops[first]))
    found = []
    for msg_id, ds in _by_message(received).items():
        first_ack = min((acked_at[d.handle] for d in ds if d.handle in acked_at), default=None)
        if first_ack is not None and any(d.invoked > first_ack for d in ds):
            found.append(msg_id)
    return sorted(found)


def _grouped_log(topic: str, sql: Any) -> list[ordering.Logged]:
    return [
        ordering.Logged(*row)
        for row in sql(
            "SELECT l.msg_id, l.message_group, l.queue_id, l.queue_offset "
            "FROM broker_commitlogentry l JOIN broker_topic t ON t.id = l.topic_id "
            "WHERE t.name = %s AND l.message_group <> ''",
            [topic],
        )
    ]


def _dead_letters(group: str, sql: Any) -> set[str]:
    return {
        msg_id
        for (msg_id,) in sql(
            "SELECT l.msg_id FROM broker_delivery d "
            'JOIN broker_commitlogentry l ON l."offset" = d.message_id '
            "JOIN broker_consumergroup g ON g.id = d.group_id "
            "WHERE g.name = %s AND d.state = 'DLQ'",
            [group],
        )
    }


def unordered(history: History, log: list[ordering.Logged], dead: set[str]) -> list[str]:
    """The ordering check (tests/chaos/ordering.py) of a FIFO consumer group's history, given
    the commit log's grouped rows and the msg_ids the group dead-lettered."""
    receipts = [
        ordering.Receipt(d.msg_id, d.handle, d.invoked, d.completed) for d in deliveries(history)
    ]
    acks = []
    for op in history.of("ack"):
        if op.type == "ok":
            acks.append(ordering.Ack(tuple(op.result["body"]["acked"]), op.invoked))
        elif op.type == "info":  # its outcome unknown: it may have acked them all
            acks.append(ordering.Ack(tuple(op.value["receipt_handles"]), op.invoked))
    return ordering.unordered(log, receipts, acks, dead)


def _skips(received: list[Delivery], topic: str, sql: Any, group_of: dict[str, str]) -> list[str]:
    """`group_of`: the message group of each grouped message, in a FIFO consumer group's
    history: there a queue's messages come in order per message group only (one group's held
    message comes after a later one of another group)."""
    found = []
    last: dict[tuple[str, int, str], int] = {}
    seen: set[str] = set()
    for d in sorted(received, key=lambda d: d.invoked):
        again = d.msg_id in seen
        seen.add(d.msg_id)
        # Order is a property of first deliveries. A message seen before is redelivered: after
        # its invisible time, or because a crash or failover undid its receive (committed with
        # synchronous_commit=off: it comes back as attempt 1; decisions 0025, 0042).
        if d.attempt != 1 or again:
            continue
        key = (d.process, d.queue_id, group_of.get(d.msg_id, ""))
        if d.queue_offset <= last.get(key, -1):
            found.append(f"{d.process} saw q{d.queue_id}@{d.queue_offset} after {last[key]}")
        last[key] = max(d.queue_offset, last.get(key, -1))
    got: dict[int, set[int]] = defaultdict(set)
    for d in received:
        got[d.queue_id].add(d.queue_offset)
    logged: dict[int, set[int]] = defaultdict(set)
    for queue_id, queue_offset in sql(
        "SELECT l.queue_id, l.queue_offset FROM broker_commitlogentry l "
        "JOIN broker_topic t ON t.id = l.topic_id WHERE t.name = %s",
        [topic],
    ):
        logged[queue_id].add(queue_offset)
    for queue_id in sorted(set(got) | set(logged)):
        dense = set(range(len(logged[queue_id])))
        if logged[queue_id] != dense:
            found.append(f"q{queue_id}: the commit log's offsets are not dense")
        if got[queue_id] != logged[queue_id]:
            missing = sorted(logged[queue_id] - got[queue_id])[:5]
            found.append(f"q{queue_id}: offsets never received {missing}")
    return found


def _by_message(received: list[Delivery]) -> dict[str, list[Delivery]]:
    """Each message's deliveries, in the order they were received."""
    by_msg: dict[str, list[Delivery]] = defaultdict(list)
    for d in received:
        by_msg[d.msg_id].append(d)
    return by_msg


def _forgotten(received: list[Delivery]) -> set[str]:
    """Handles of receives the server forgot (a crash undid their commit): the same message was
    delivered again later with no higher attempt number."""
    return {
        d.handle
        for ds in _by_message(received).values()
        for d in ds
        if any(later.invoked > d.invoked and later.attempt <= d.attempt for later in ds)
    }


def _receives_undone(received: list[Delivery]) -> int:
    """Messages delivered as attempt 1 more than once: the server forgot the first receive."""
    firsts: dict[str, int] = defaultdict(int)
    for d in received:
        if d.attempt == 1:
            firsts[d.msg_id] += 1
    return sum(1 for count in firsts.values() if count > 1)


def _conflicts(history: History, topic: str, sql: Any) -> list[str]:
    found = []
    rows = sql(
        "SELECT h.transaction_id::text, h.state, convert_from(h.body, 'UTF8'), "
        "  (SELECT count(*) FROM broker_oprecord o WHERE o.half_id = h.id "
        "     AND o.op IN ('COMMIT', 'ROLLBACK')), "
        "  (SELECT min(o.op) FROM broker_oprecord o WHERE o.half_id = h.id "
        "     AND o.op IN ('COMMIT', 'ROLLBACK')), "
        "  (SELECT count(*) FROM broker_commitlogentry l "
        "     WHERE l.transaction_id = h.transaction_id) "
        "FROM broker_halfmessage h JOIN broker_topic t ON t.id = h.topic_id WHERE t.name = %s",
        [topic],
    )
    final_state = {"COMMIT": "COMMITTED", "ROLLBACK": "ROLLED_BACK"}
    state_of_body = {}
    for transaction_id, state, body, finals, final_op, logged in rows:
        state_of_body[body] = state
        if finals > 1:
            found.append(f"{transaction_id}: {finals} final ops")
        if finals == 1 and final_state[final_op] != state:
            found.append(f"{transaction_id}: state {state} but final op {final_op}")
        if state in {"COMMITTED", "ROLLED_BACK"} and finals != 1:
            found.append(f"{transaction_id}: state {state} with {finals} final ops")
        if logged != (1 if state == "COMMITTED" else 0):
            found.append(f"{transaction_id}: {state} with {logged} commit-log rows")
        intent, _ = intent_of(body)
        expected = {"COMMIT": "COMMITTED", "ROLLBACK": "ROLLED_BACK", "UNKNOWN": "PARKED"}[intent]
        if state != expected:
            found.append(f"{transaction_id} ({body}): {state}, the producer decided {intent}")
    for body, count in sql(
        "SELECT convert_from(h.body, 'UTF8'), count(*) FROM broker_halfmessage h "
        "JOIN broker_topic t ON t.id = h.topic_id WHERE t.name = %s GROUP BY 1 HAVING count(*) > 1",
        [topic],
    ):
        found.append(f"prepare {body} stored {count} times")
    transaction_of_body = {row[2]: row[0] for row in rows}
    for op in history.of("prepare"):
        if op.type == "ok":
            answered = op.result["body"]["transaction_id"]
            if transaction_of_body.get(op.value["body"]) != answered:
                found.append(f"prepare of {op.value['body']} answered {answered}, not stored")
    for op in history.of("commit", "rollback"):
        state = state_of_body.get(op.value["body"])
        if op.type == "ok" and state != final_state[op.f.upper()]:
            found.append(f"{op.f} of {op.value['body']} answered ok, the database says {state}")
    for body, count in sql(
        "SELECT convert_from(body, 'UTF8'), count(*) FROM broker_commitlogentry "
        "WHERE transaction_id IS NULL AND topic_id = (SELECT id FROM broker_topic WHERE name = %s) "
        "GROUP BY 1 HAVING count(*) > 1",
        [topic],
    ):
        found.append(f"send {body} stored {count} times")
    return found


def _unavailable(history: History) -> float:
    """The longest time during which producers' requests were made but none succeeded."""
    ops = sorted(
        (op for op in history.of("send", "prepare", "commit", "rollback") if op.completed),
        key=lambda op: op.invoked,
    )
    longest, since = 0.0, None
    for op in ops:
        if op.type == "ok":
            if since is not None:
                longest = max(longest, _done(op) - since)
            since = None
        elif since is None:
            since = op.invoked
    return longest


def _done(op: Op) -> float:
    assert op.completed is not None
    return op.completed
