"""A highly available txhub in `make test`, on one cluster of its own shared by the module
(scripts/ha.sh on free ports: Patroni, etcd, Redis Sentinels; two beats; docs/decisions/0042):
F14 shortened (the primary's machine dies under load: nothing acknowledged is lost, the old
primary rejoins by itself), gRPC streams and waiting receives through a planned switchover, and a
receive undone by a failover (decision 0025: it comes back, nothing is lost). `make chaos` runs
F14-F19 at full length (tests/chaos/run.py)."""

import contextlib
import functools
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer

from tests.chaos.cluster import wait_for
from tests.chaos.ha import HACluster, make_groups
from tests.chaos.run import CASES, SETTINGS, run_case
from tests.support.grpc import Checker, message

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.destructive,
    pytest.mark.usefixtures("event_loop_in_main_thread"),
]
T = TypeVar("T")


@pytest.fixture(scope="module")
def ha() -> Iterator[HACluster]:
    cluster = HACluster(settings=SETTINGS)
    try:
        cluster.start()
        cluster.token = cluster.manage("create_token", "chaos", "--scope", "admin").split()[0]
        yield cluster
    finally:
        cluster.stop()
        cluster.cleanup()


def api(cluster: HACluster, path: str, payload: dict[str, Any], timeout: float = 30) -> Any:
    return requests.post(
        f"{cluster.base}/api/v1{path}",
        json=payload,
        headers={"Authorization": f"Bearer {cluster.token}"},
        timeout=timeout,
    )


def setup(cluster: HACluster, name: str) -> None:
    make_groups(f"{cluster.base}/api/v1", {"Authorization": f"Bearer {cluster.token}"}, name)


def until_done(call: Callable[[], T], timeout: float = 60) -> T:
    """`call` again until it returns instead of raising: a client's call while no primary is
    reachable may fail (its outcome is then unknown), and is retried as an application would."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def wakeup_listeners(cluster: HACluster, node: int) -> int:
    """The LISTEN connections (apps/broker/wakeups.py) of txhub processes on `node`."""
    [(count,)] = cluster.node_sql(
        node, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'txhub-wakeups'"
    )
    return int(count)


@pytest.mark.timeout(400)
def test_losing_the_primary_loses_nothing_acknowledged(ha: HACluster, tmp_path: Path) -> None:
    report = run_case(ha, ha.token, CASES["F14"], scale=0.3, out=tmp_path, seed=3)
    print(report.line())
    print(report.details())
    assert report.ok, report.details()
    assert report.ops > 100
    assert any("rejoin" in note or "streaming again" in note for note in report.notes)


@pytest.mark.timeout(300)
def test_grpc_streams_and_listeners_carry_on_through_a_switchover(ha: HACluster) -> None:
    """A producer's Telemetry stream and a SimpleConsumer (the official Python client) stay
    usable through `patronictl switchover`: a check-back after it reaches the producer on its
    stream (the group has no check URL), and every LISTEN connection of txhub's processes is on
    the new primary again (decision 0042), so waiting receives are woken."""
    ha.wait_healthy(timeout=120)
    endpoint = f"127.0.0.1:{ha.grpc_start()}"
    setup(ha, "ha-grpc")
    scopes = ["--scope", "produce:ha-grpc", "--scope", "consume:ha-grpc"]
    keys = json.loads(ha.manage("create_token", "ha-grpc", *scopes, "--json"))
    config = ClientConfiguration(endpoint, Credentials(keys["access_key"], keys["secret_key"]))
    checker = Checker()
    producer = Producer(config, ("ha-grpc",), checker)
    consumer = SimpleConsumer(config, "ha-grpc", {"ha-grpc": FilterExpression("*")}, 5)
    clients: list[Any] = []
    try:
        for client in (producer, consumer):
            client.startup()
            clients.append(client)
        before = producer.send(message("ha-grpc", b"before"))
        assert [m.message_id for m in receive(consumer, 1)] == [before.message_id]
        old = ha.primary()
        assert old is not None
        listening = wakeup_listeners(ha, old)
        assert listening >= 1  # the gRPC process's, at least (its long polls above)

        members = ha.rest(old, "/cluster").json()["members"]
        candidate = next(m["name"] for m in members if m["role"] == "sync_standby")
        answer = ha.post(old, "/switchover", {"leader": f"node{old}", "candidate": candidate})
        assert answer.status_code == 200, answer.text
        new = ha.wait_primary(other_than=old, timeout=60)

        # Left open: TXHUB_TRANSACTION_TIMEOUT later the check goes out on the producer's stream.
        transaction = producer.begin_transaction()
        checked = until_done(lambda: producer.send(message("ha-grpc", b"checked"), transaction))
        after = until_done(lambda: producer.send(message("ha-grpc", b"after")))
        wait_for(lambda: checked.message_id in checker.checked, 60, "the check on the stream")
        got = receive(consumer, 2)
        assert sorted(m.message_id for m in got) == sorted([checked.message_id, after.message_id])
        wait_for(lambda: wakeup_listeners(ha, new) >= listening, 30, "every LISTEN reconnected")
    finally:
        for client in reversed(clients):
            client.shutdown()


def receive(consumer: Any, count: int, timeout: float = 60) -> list[Any]:
    """`count` messages, each acked, through the consumer's long polls (retried as above)."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            for item in consumer.receive(32, 30) or []:
                until_done(functools.partial(consumer.ack, item))
                got.append(item)
    return got


def walsenders(cluster: HACluster, node: int) -> list[int]:
    return [pid for (pid,) in cluster.node_sql(node, "SELECT pid FROM pg_stat_replication")]


@pytest.mark.timeout(300)
def test_a_receive_undone_by_a_failover_comes_back_and_nothing_is_lost(ha: HACluster) -> None:
    """With TXHUB_RECEIVE_SYNCHRONOUS_COMMIT off (the single node's default; a cluster's is on,
    decision 0050) a receive commits without waiting for a standby (decision 0025). Forced: the
    primary's WAL senders are stopped, so nothing after the send reaches a standby; the receive
    is answered, an ack after it is not (it waits for a standby), and the primary's machine
    dies. On the promoted standby the receive never happened: the message is received again at
    once, long before its invisible time, as its first delivery, and the first receive's handle
    acks nothing (at-least-once, never lost; decision 0042)."""
    ha.wait_healthy(timeout=120)
    ha.web_restart(TXHUB_RECEIVE_SYNCHRONOUS_COMMIT="0")
    try:
        _undo_a_receive(ha)
    finally:
        ha.web_restart()  # the cluster's own settings for whatever runs after


def _undo_a_receive(ha: HACluster) -> None:
    setup(ha, "ha-undo")
    sent = api(ha, "/topics/ha-undo/messages", {"producer_group": "ha-undo", "body": "once"})
    assert sent.status_code == 201, sent.text  # on two nodes (synchronous replication)
    msg_id = sent.json()["msg_id"]
    receive_it = {"topic": "ha-undo", "invisible_seconds": 600, "wait_seconds": 5}
    old = ha.primary()
    assert old is not None
    senders = walsenders(ha, old)
    assert len(senders) == 2
    for pid in senders:
        os.kill(pid, signal.SIGSTOP)
    try:
        first = api(ha, "/consumer-groups/ha-undo/receive", receive_it)
        assert first.status_code == 200, first.text
        [(first_message)] = first.json()["messages"]
        assert (first_message["msg_id"], first_message["delivery_attempt"]) == (msg_id, 1)
        with pytest.raises(requests.Timeout):  # an ack waits for a standby: none hears it
            api(
                ha,
                "/consumer-groups/ha-undo/ack",
                {"receipt_handles": [first_message["receipt_handle"]]},
                timeout=2,
            )
        ha.signal_node(old, signal.SIGKILL)
    finally:
        for pid in senders:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    ha.wait_primary(other_than=old, timeout=90)

    def received_again() -> dict[str, Any]:
        answer = api(ha, "/consumer-groups/ha-undo/receive", receive_it)
        assert answer.status_code == 200, answer.text
        [again] = answer.json()["messages"]
        return dict(again)

    again = until_done(received_again, timeout=90)
    assert (again["msg_id"], again["delivery_attempt"]) == (msg_id, 1)
    handles = [first_message["receipt_handle"], again["receipt_handle"]]
    acked = api(ha, "/consumer-groups/ha-undo/ack", {"receipt_handles": handles})
    assert acked.status_code == 200, acked.text
    assert acked.json() == {"acked": handles[1:], "invalid": handles[:1]}
    ha.start_node(old)  # the module's cluster whole again for whatever runs after
    ha.wait_rejoined(old, timeout=120)
