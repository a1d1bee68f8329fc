"""CONTRACT invariant 4 for the newer write paths: a web process killed (SIGKILL) in the middle of
a recall (decisions 0055, 0075), a FIFO group's release (0054) or a consumer group's deletion
(0088), and a Celery worker killed in the middle of retention's deletion (0080), leave nothing
half applied, and the same work done again once the process is back is applied whole: the
storage measure's counters (0085, 0089) move once, the group's next message is handed out, the
token's scope goes with the group.

A server or worker of the test's own does the work; a session of the test's own holds a lock
that a statement late in the work's transaction waits for, after its first writes. The process
is killed while that statement waits (seen in pg_stat_activity), then the lock is let go:
Postgres ends the dead client's transaction. Nothing is mocked."""

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import requests
from celery import Celery as CeleryApp

from apps.broker.services import registry, storage_usage
from apps.broker.services.delivery import delayed_deliver_due
from tests.conftest import start_gunicorn
from tests.e2e.conftest import Celery
from tests.support import killed_mid_write
from tests.support.killed_mid_write import execute, rows
from tests.support.ports import free_port
from tests.support.statement_faults import own_connection
from tests.support.storage import counted_for_good

pytestmark = [pytest.mark.e2e, pytest.mark.destructive]


class Web:
    """A gunicorn of the test's own, killed with SIGKILL and started again on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: Any = None

    def start(self) -> None:
        self.process = start_gunicorn(self.port, workers=1, threads=4)

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self.process = None

    def stop(self) -> None:
        if self.process is not None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=30)
            self.process = None

    def call(self, method: str, path: str, token: str, body: Any = None) -> requests.Response:
        return requests.request(
            method,
            f"http://127.0.0.1:{self.port}/api/v1{path}",
            headers={"Authorization": f"Bearer {token}"},
            json=body,
            timeout=killed_mid_write.SECONDS,
        )

    def call_killed(
        self, method: str, path: str, token: str, body: Any, holder: psycopg.Connection
    ) -> None:
        """Makes the call and kills the server while it waits for `holder`'s lock."""
        answer = killed_mid_write.call_killed(
            lambda: self.call(method, path, token, body), self.kill, holder
        )
        assert isinstance(answer, requests.RequestException), answer  # never answered


@pytest.fixture
def web(transactional_db: None) -> Iterator[Web]:
    server = Web()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def hub(web: Web) -> Callable[..., str]:
    """A topic, a producer group and a consumer group; returns an admin token."""
    _, token = registry.token_create(name="crash-admin", scopes=["admin"])

    def make(*, fifo: bool = False) -> str:
        for path, body in [
            ("/topics", {"name": "crash-orders", "queues": 1}),
            ("/producer-groups", {"name": "crash-shop", "check_url": "https://127.0.0.1:9/"}),
            (
                "/consumer-groups",
                {
                    "name": "crash-billing",
                    "max_delivery_attempts": 16,
                    "consume_from": "first",
                    "fifo": fifo,
                },
            ),
        ]:
            created = web.call("POST", path, token, body)
            assert created.status_code == 201, created.text
        return token

    return make


def _send(web: Web, token: str, **fields: Any) -> str:
    body = {"producer_group": "crash-shop", "body": "b", **fields}
    sent = web.call("POST", "/topics/crash-orders/messages", token, body)
    assert sent.status_code == 201, sent.text
    return str(sent.json()["msg_id"])


def _delayed_bytes() -> int:
    [(counted,)] = rows(
        "SELECT coalesce(sum(counted + recent), 0) FROM broker_storedbytes "
        "WHERE producer_group = 'crash-shop' AND stored_table = 'broker_delayedmessage'"
    )
    return int(counted)


def test_a_recall_killed_before_its_commit_leaves_the_message_waiting(
    web: Web, hub: Callable[..., str]
) -> None:
    token = hub()
    kept = _send(web, token, delay_level=10, body="kept")
    recalled = _send(web, token, delay_level=10, body="recalled, once")
    # Both rows counted for good: each deletion takes its bytes off (0085, 0095).
    counted_for_good()
    before = _delayed_bytes()
    assert before > 0
    with own_connection(autocommit=False) as holder:
        # The recall's last statement (forget_rows) waits for this, after its INSERT and DELETE.
        holder.execute(
            "SELECT 1 FROM broker_storedbytes WHERE producer_group = 'crash-shop' FOR UPDATE"
        )
        web.call_killed("POST", f"/messages/{recalled}/recall", token, None, holder)
    assert rows("SELECT msg_id FROM broker_recalledmessage") == []
    assert {r[0] for r in rows("SELECT msg_id FROM broker_delayedmessage")} == {kept, recalled}
    assert _delayed_bytes() == before

    web.start()
    answer = web.call("POST", f"/messages/{recalled}/recall", token)
    assert answer.status_code == 200, answer.text
    assert [r[0] for r in rows("SELECT msg_id FROM broker_delayedmessage")] == [kept]
    [(size,)] = rows(
        f"SELECT {storage_usage.SIZE_SQL.format(t='m')} FROM broker_recalledmessage m"  # noqa: S608
    )
    assert _delayed_bytes() == before - size  # taken off once
    # Made due now: the delivery moves the one left, never the recalled one.
    execute("UPDATE broker_delayedmessage SET deliver_at = now() - interval '1 second'")
    delayed_deliver_due()
    assert [r[0] for r in rows("SELECT msg_id FROM broker_commitlogentry")] == [kept]


# The test's own wait in an INSERT into broker_delivery: for the advisory lock FIFO_STEP, which
# the test holds while it kills the server (a statement-level trigger; dropped after the test).
FIFO_STEP = 0x7478_6835


@pytest.fixture
def wait_in_delivery_insert(web: Web) -> Iterator[None]:
    with killed_mid_write.inserts_wait(
        "broker_delivery", FIFO_STEP, name="crash_test_wait", each="STATEMENT"
    ):
        yield


def test_a_fifo_release_killed_mid_way_or_unanswered_holds_up_its_group_no_longer(
    web: Web, hub: Callable[..., str], wait_in_delivery_insert: None
) -> None:
    token = hub(fifo=True)
    first = _send(web, token, message_group="order-1", body="first")
    second = _send(web, token, message_group="order-1", body="second")
    path = "/consumer-groups/crash-billing"
    body = {"topic": "crash-orders", "max_messages": 2}
    # `second` waits behind `first`, held (decision 0054).
    got = web.call("POST", f"{path}/receive", token, body)
    [head] = got.json()["messages"]
    assert head["msg_id"] == first
    other = _send(web, token, message_group="order-2", body="other")
    acked = web.call("POST", f"{path}/ack", token, {"receipt_handles": [head["receipt_handle"]]})
    assert acked.status_code == 200, acked.text
    states = "SELECT m.msg_id, d.state FROM broker_delivery d JOIN broker_commitlogentry m "
    states += 'ON m."offset" = d.message_id ORDER BY m."offset"'
    assert rows(states) == [(first, "ACKED"), (second, "HELD")]

    # Killed between the release of `second` and the insert of `other`'s delivery.
    with own_connection(autocommit=False) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", [FIFO_STEP])
        web.call_killed("POST", f"{path}/receive", token, body, holder)
    assert rows(states) == [(first, "ACKED"), (second, "HELD")]

    # Killed at its commit (which waits for `other`'s row: the deliveries' foreign key is
    # checked then): committed, never answered.
    web.start()
    with own_connection(autocommit=False) as holder:
        holder.execute("SELECT 1 FROM broker_commitlogentry WHERE msg_id = %s FOR UPDATE", [other])
        web.call_killed("POST", f"{path}/receive", token, body, holder)
    assert rows(states) == [(first, "ACKED"), (second, "INFLIGHT"), (other, "INFLIGHT")]

    # Once their invisible time is over (moved here rather than waited for), both come again.
    web.start()
    execute("UPDATE broker_delivery SET invisible_until = now() WHERE state = 'INFLIGHT'")
    again = web.call("POST", f"{path}/receive", token, body)
    assert again.status_code == 200, again.text
    assert sorted(m["msg_id"] for m in again.json()["messages"]) == sorted([second, other])


def test_a_group_deletion_killed_before_its_commit_leaves_the_group_whole(
    web: Web, hub: Callable[..., str]
) -> None:
    token = hub()
    consumer, _ = registry.token_create(name="crash-consumer", scopes=["consume:crash-billing"])
    _send(web, token)
    got = web.call(
        "POST", "/consumer-groups/crash-billing/receive", token, {"topic": "crash-orders"}
    )
    assert len(got.json()["messages"]) == 1
    held = (
        "SELECT (SELECT count(*) FROM broker_consumergroup WHERE name = 'crash-billing'), "
        "(SELECT count(*) FROM broker_consumercursor), (SELECT count(*) FROM broker_delivery), "
        "(SELECT scopes FROM broker_apitoken WHERE id = %s)"
    )
    assert rows(held, consumer.pk) == [(1, 1, 1, ["consume:crash-billing"])]
    with own_connection(autocommit=False) as holder:
        # The deletion removes the deliveries, cursors and group, then waits here for the token.
        holder.execute("SELECT 1 FROM broker_apitoken WHERE id = %s FOR UPDATE", [consumer.pk])
        web.call_killed("DELETE", "/consumer-groups/crash-billing", token, None, holder)
    assert rows(held, consumer.pk) == [(1, 1, 1, ["consume:crash-billing"])]

    web.start()
    deleted = web.call("DELETE", "/consumer-groups/crash-billing", token)
    assert deleted.status_code in (200, 204), deleted.text
    assert rows(held, consumer.pk) == [(0, 0, 0, [])]


def _commit_log_bytes() -> int:
    [(counted,)] = rows(
        "SELECT coalesce(sum(counted + recent), 0) FROM broker_storedbytes "
        "WHERE producer_group = 'crash-shop' AND stored_table = 'broker_commitlogentry'"
    )
    return int(counted)


def _run_task(celery: Celery, name: str) -> None:
    app = CeleryApp(broker=celery.env["CELERY_BROKER_URL"])
    try:
        app.send_task(f"apps.broker.tasks.{name}")
    finally:
        app.close()


def test_a_retention_deletion_killed_before_its_commit_keeps_rows_and_their_count(
    web: Web, hub: Callable[..., str], start_celery: Callable[..., Celery]
) -> None:
    token = hub()
    sent = {_send(web, token, body=f"old {i}") for i in range(3)}
    counted_for_good()
    before = _commit_log_bytes()
    assert before > 0
    celery = start_celery(workers=1, beat=False, TXHUB_RETENTION="1")
    time.sleep(1.5)  # all three older than the retention, and no group holds them
    [worker, _callbacks] = celery.workers
    with own_connection(autocommit=False) as holder:
        # The sweep's last statement (forget_rows) waits for this, after its two DELETEs.
        holder.execute(
            "SELECT 1 FROM broker_storedbytes WHERE producer_group = 'crash-shop' FOR UPDATE"
        )
        _run_task(celery, "retention_sweep")
        waiting = killed_mid_write.backend_waiting_for(holder)
        celery.kill_worker(worker)
        holder.rollback()
        killed_mid_write.wait_gone(waiting)
    assert {r[0] for r in rows("SELECT msg_id FROM broker_commitlogentry")} == sent
    assert _commit_log_bytes() == before

    celery.start_worker()
    celery.wait_ready()
    _run_task(celery, "retention_sweep")
    deadline = time.monotonic() + killed_mid_write.SECONDS
    while rows("SELECT msg_id FROM broker_commitlogentry") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rows("SELECT msg_id FROM broker_commitlogentry") == []
    assert _commit_log_bytes() == 0  # taken off once, whole


_COUNTS_SQL = (
    "SELECT s.stored_table, s.counted, s.recent, m.counted_to, m.seen_to FROM broker_storedbytes s "
    "JOIN broker_storagemeasure m USING (stored_table) WHERE s.producer_group = 'crash-shop' "
    "ORDER BY 1"
)


def _next_measure_counts_for_good() -> None:
    """Measures until the commit log's rows are seen, then waits until every transaction that
    was running then has ended: the next measure counts them for good (decision 0095). Other
    tests' transactions on the same Postgres can hold that back for a while."""
    deadline = time.monotonic() + 60
    seen = (
        'SELECT m.seen_to >= (SELECT max("offset") FROM broker_commitlogentry), '
        "pg_snapshot_xmin(pg_current_snapshot())::text::bigint >= m.seen_horizon "
        "FROM broker_storagemeasure m WHERE m.stored_table = 'broker_commitlogentry'"
    )
    storage_usage.storage_measure()
    while not rows(seen)[0][0]:
        assert time.monotonic() < deadline, "the rows were not seen by a measure"
        storage_usage.storage_measure()
    while not rows(seen)[0][1]:
        assert time.monotonic() < deadline, "the transactions running at the measure never ended"
        time.sleep(0.1)


def test_a_storage_measure_killed_before_its_commit_counts_nothing_twice(
    web: Web, hub: Callable[..., str], start_celery: Callable[..., Celery]
) -> None:
    token = hub()
    for i in range(3):
        _send(web, token, body=f"counted {i}")
    _next_measure_counts_for_good()
    before = rows(_COUNTS_SQL)
    celery = start_celery(workers=1, beat=False)
    [worker, _callbacks] = celery.workers
    with own_connection(autocommit=False) as holder:
        # The measure's statement that counts the rows for good waits for this.
        holder.execute(
            "SELECT 1 FROM broker_storedbytes WHERE producer_group = 'crash-shop' FOR UPDATE"
        )
        _run_task(celery, "storage_measure")
        waiting = killed_mid_write.backend_waiting_for(holder)
        celery.kill_worker(worker)
        holder.rollback()
        killed_mid_write.wait_gone(waiting)
    assert rows(_COUNTS_SQL) == before

    celery.start_worker()
    celery.wait_ready()
    _run_task(celery, "storage_measure")
    [(size,)] = rows(
        f"SELECT sum({storage_usage.SIZE_SQL.format(t='e')}) FROM broker_commitlogentry e"  # noqa: S608
    )
    deadline = time.monotonic() + killed_mid_write.SECONDS
    while rows(_COUNTS_SQL) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    [(table, counted, recent, _, _)] = rows(_COUNTS_SQL)
    assert (table, counted, recent) == ("broker_commitlogentry", size, 0)


# The test's own wait in the INSERT of a PARK op: for the advisory lock PARK_STEP (a row trigger;
# dropped after the test).
PARK_STEP = 0x7478_6836


@pytest.fixture
def wait_in_park(web: Web) -> Iterator[None]:
    with killed_mid_write.inserts_wait(
        "broker_oprecord", PARK_STEP, name="crash_test_park", when="NEW.op = 'PARK'"
    ):
        yield


def test_a_check_killed_as_it_parks_at_check_max_is_counted_and_parked_once(
    web: Web, start_celery: Callable[..., Celery], checker: Any, wait_in_park: None
) -> None:
    registry.topic_create(name="crash-orders", queues=1)
    registry.producer_group_create(name="crash-shop", check_url=checker.url)
    _, token = registry.token_create(name="crash-producer", scopes=["produce:crash-shop"])
    checker.answer("UNKNOWN")
    celery = start_celery(workers=1, beat=True, TXHUB_CHECK_MAX="1")
    [_scans, callbacks] = celery.workers
    half = "SELECT state, check_times FROM broker_halfmessage"
    ops = "SELECT op FROM broker_oprecord ORDER BY id"
    with own_connection(autocommit=False) as holder:
        # The check's answer is recorded, counted and reaches TXHUB_CHECK_MAX; its PARK op waits.
        holder.execute("SELECT pg_advisory_xact_lock(%s)", [PARK_STEP])
        body = {"producer_group": "crash-shop", "topic": "crash-orders", "body": "order"}
        prepared = web.call("POST", "/transactions", token, body)
        assert prepared.status_code == 201, prepared.text
        waiting = killed_mid_write.backend_waiting_for(holder)
        celery.kill_worker(callbacks)
        holder.rollback()
        killed_mid_write.wait_gone(waiting)
    assert rows(half) == [("PREPARED", 0)]
    assert [r[0] for r in rows(ops)] == ["PREPARE"]

    celery.start_worker(concurrency=4, queue="callbacks")
    celery.wait_ready()
    # The killed check's lease, over now rather than waited for.
    execute("UPDATE broker_halfmessage SET checking_until = NULL, next_check_at = now()")
    deadline = time.monotonic() + killed_mid_write.SECONDS
    while rows(half) != [("PARKED", 1)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rows(half) == [("PARKED", 1)]
    assert [r[0] for r in rows(ops)] == ["PREPARE", "CHECK", "PARK"]
