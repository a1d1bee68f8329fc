"""The chaos checker in `make test`: a private cluster (its own Postgres, Redis, gunicorn, Celery),
the short cases, and positive controls proving the checker sees each kind of violation.
`make chaos` runs every case at full length (tests/chaos/run.py)."""

from collections import Counter
from collections.abc import Iterator
from copy import deepcopy
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest

from tests.chaos.check import Report, check, deliveries
from tests.chaos.cluster import Cluster
from tests.chaos.history import History
from tests.chaos.run import CASES, SETTINGS, run_case

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.destructive]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    cluster = Cluster(settings=SETTINGS)
    try:
        cluster.start()
        cluster.token = cluster.manage("create_token", "chaos", "--scope", "admin").strip()
        yield cluster
    finally:
        cluster.stop()
        cluster.cleanup()


def _short(
    cluster: Cluster, name: str, seed: int, tmp: pytest.TempPathFactory
) -> tuple[Report, History]:
    """A case shortened, with no violation; its report and its history."""
    out = tmp.mktemp("chaos")
    report = run_case(cluster, cluster.token, CASES[name], scale=0.3, out=out, seed=seed)
    print(report.line())
    assert report.ok, report.details()
    return report, _load(out / f"history-{name}.jsonl")


@pytest.fixture(scope="module")
def baseline(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, History]:
    return "chaos-F1", _short(cluster, "F1", 1, tmp_path_factory)[1]


def test_baseline_history_is_clean(baseline: tuple[str, History]) -> None:
    _, history = baseline
    kinds = {op.f for op in history.ops if op.type == "ok"}
    assert kinds == {"send", "prepare", "commit", "rollback", "receive", "ack"}


@pytest.mark.parametrize("name", ["F2", "F3", "F5", "F8", "F10"])
def test_short_fault_case_finds_no_violation(
    cluster: Cluster, name: str, tmp_path: Path, baseline: tuple[str, History]
) -> None:
    report = run_case(cluster, cluster.token, CASES[name], scale=0.3, out=tmp_path, seed=2)
    print(report.line())
    assert report.ok, report.details()
    assert report.ops > 100


@pytest.fixture(scope="module")
def fifo(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, History]:
    """F20 shortened: FIFO traffic while web workers and consumers are killed (issue 29)."""
    report, history = _short(cluster, "F20", 3, tmp_path_factory)
    assert report.unordered == []
    assert report.ops > 100
    return "chaos-F20", history


def test_checker_sees_a_message_handed_out_before_its_groups_head_was_acked(
    cluster: Cluster, fifo: tuple[str, History]
) -> None:
    """The F20 history, clean, with one receipt moved: the second message of a message group
    received right after the first one, before its ack."""
    topic, history = fifo
    assert check("control", topic, history, cluster.sql, fifo_group=f"{topic}-consumer").ok
    broken = _copy(history)
    received = deliveries(broken)
    seen = {d.msg_id for d in received}
    rows = cluster.sql(
        "SELECT l.message_group, l.msg_id FROM broker_commitlogentry l JOIN broker_topic t "
        "ON t.id = l.topic_id WHERE t.name = %s AND l.message_group <> '' "
        "ORDER BY l.message_group, l.queue_offset",
        [topic],
    )
    first, second = next((a[1], b[1]) for a, b in pairwise(rows) if a[0] == b[0] and a[1] in seen)
    head = min((d for d in received if d.msg_id == first), key=lambda d: d.invoked)
    receive = next(op for op in broken.ops if op.f == "receive" and op.invoked == head.invoked)
    message = next(m for m in receive.result["body"]["messages"] if m["msg_id"] == first)
    # Answered with the head's own receive: before the head's ack can have been sent.
    early = replace(receive, index=len(broken.ops))
    early.result = {
        "status": 200,
        "body": {"messages": [{**message, "msg_id": second, "receipt_handle": "x.y"}]},
    }
    broken.ops.append(early)
    report = check("control", topic, broken, cluster.sql, fifo_group=f"{topic}-consumer")
    assert any(second in item for item in report.unordered or []), report.unordered


# Positive controls: the same clean history, with one violation put in, is caught.


def test_checker_sees_a_lost_message(cluster: Cluster, baseline: tuple[str, History]) -> None:
    topic, history = baseline
    broken = _copy(history)
    seen = Counter(d.msg_id for d in deliveries(broken))
    receive, lost = next(
        (op, m)
        for op in broken.ops
        if op.f == "receive" and op.type == "ok"
        for m in op.result["body"]["messages"]
        if seen[m["msg_id"]] == 1 and "|SEND" in m["body"]
    )
    receive.result["body"]["messages"].remove(lost)
    report = check("control", topic, broken, cluster.sql)
    assert report.lost == [lost["body"]]
    assert report.skipped == [
        f"q{lost['queue_id']}: offsets never received [{lost['queue_offset']}]"
    ]


def test_checker_sees_a_duplicate_after_ack(
    cluster: Cluster, baseline: tuple[str, History]
) -> None:
    topic, history = baseline
    broken = _copy(history)
    acked = next(op for op in broken.ops if op.f == "ack" and op.type == "ok")
    handle = acked.result["body"]["acked"][0]
    receive = next(
        op
        for op in broken.ops
        if op.f == "receive"
        and any(
            m["receipt_handle"] == handle for m in op.result.get("body", {}).get("messages", [])
        )
    )
    message = next(m for m in receive.result["body"]["messages"] if m["receipt_handle"] == handle)
    assert acked.completed is not None
    later = replace(receive, index=len(broken.ops), invoked=acked.completed + 1)
    later.result = {"status": 200, "body": {"messages": [{**message, "receipt_handle": "x.y"}]}}
    broken.ops.append(later)
    assert check("control", topic, broken, cluster.sql).duplicated == [message["msg_id"]]


def test_checker_sees_first_deliveries_out_of_order(
    cluster: Cluster, baseline: tuple[str, History]
) -> None:
    topic, history = baseline
    broken = _copy(history)
    receive = next(
        op
        for op in reversed(broken.ops)
        if op.f == "receive" and op.type == "ok" and op.result["body"]["messages"]
    )
    message = receive.result["body"]["messages"][-1]
    # A message never seen before, first delivered at offset 0 after later offsets of its queue:
    # a skip. (A message seen before coming back is a redelivery, and is not.)
    later = replace(receive, index=len(broken.ops), invoked=receive.invoked + 0.001)
    later.result = {
        "status": 200,
        "body": {
            "messages": [
                {**message, "msg_id": "never-seen", "queue_offset": 0, "delivery_attempt": 1}
            ]
        },
    }
    broken.ops.append(later)
    again = replace(receive, index=len(broken.ops), invoked=receive.invoked + 0.002)
    again.result = {"status": 200, "body": {"messages": [{**message, "delivery_attempt": 1}]}}
    broken.ops.append(again)
    skipped = check("control", topic, broken, cluster.sql).skipped
    assert any(f"saw q{message['queue_id']}@0 after" in item for item in skipped), skipped
    assert len(skipped) == 1, skipped


def test_checker_sees_a_rolled_back_message_delivered(
    cluster: Cluster, baseline: tuple[str, History]
) -> None:
    topic, history = baseline
    broken = _copy(history)
    rolled_back = next(op for op in broken.ops if op.f == "rollback" and op.type == "ok")
    receive = next(op for op in broken.ops if op.f == "receive" and op.type == "ok")
    receive.result = deepcopy(receive.result)
    receive.result["body"]["messages"].append(
        {
            "msg_id": "X",
            "body": rolled_back.value["body"],
            "queue_id": 0,
            "queue_offset": 10**6,
            "delivery_attempt": 1,
            "receipt_handle": "1.x",
        }
    )
    report = check("control", topic, broken, cluster.sql)
    assert rolled_back.value["body"] in report.unexpected


def test_checker_sees_a_second_final_op(cluster: Cluster, baseline: tuple[str, History]) -> None:
    topic, history = baseline
    [(half_id, transaction_id)] = cluster.sql(
        "SELECT h.id, h.transaction_id::text FROM broker_halfmessage h JOIN broker_topic t "
        "ON t.id = h.topic_id WHERE t.name = %s AND h.state = 'COMMITTED' LIMIT 1",
        [topic],
    )
    # The database forbids it (a partial unique index); the checker must not rely on that alone.
    cluster.sql("DROP INDEX one_final_op_per_transaction")
    cluster.sql(
        "INSERT INTO broker_oprecord (half_id, op, source, actor, reason, detail, at) "
        "VALUES (%s, 'ROLLBACK', 'OPERATOR', 'chaos', '', '{}', now())",
        [half_id],
    )
    try:
        report = check("control", topic, history, cluster.sql)
        assert any(transaction_id in item for item in report.conflicting)
    finally:
        cluster.sql(
            "DELETE FROM broker_oprecord WHERE half_id = %s AND actor = 'chaos'",
            [half_id],
        )
        cluster.sql(
            "CREATE UNIQUE INDEX one_final_op_per_transaction ON broker_oprecord (half_id) "
            "WHERE op IN ('COMMIT', 'ROLLBACK')"
        )


def _copy(history: History) -> History:
    copied = History()
    copied.ops = deepcopy(history.ops)
    return copied


def _load(path: Path) -> History:
    import json

    from tests.chaos.history import Op

    history = History()
    history.ops = [Op(**json.loads(line)) for line in path.read_text().splitlines()]
    return history
