"""What synchronous replication asks of each write (docs/decisions/0042, 0025), on the test's
own Postgres (`private_cluster`) told to wait for a standby that never comes: a send and an ack
are answered only once a standby has them (here: never, until the wait is lifted), while a
receive (`synchronous_commit = off`) is answered at once. So across a failover a receive may be
undone (its message comes back before its invisible time: at-least-once), but never an ack or a
send that was answered: WAL reaches the standby in order, and their answers waited for it."""

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

pytestmark = pytest.mark.e2e


def _wait_for_a_standby(cluster: Any, name: str) -> None:
    cluster.sql(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")
    cluster.sql("SELECT pg_reload_conf()")
    time.sleep(0.5)  # every backend has read it


@contextlib.contextmanager
def _web(cluster: Any, **env: str) -> Iterator[None]:
    """The cluster's web server for one test; after it, no standby is waited for."""
    cluster.web_start(**env)
    try:
        yield
    finally:
        _wait_for_a_standby(cluster, "")  # the waiting commits return
        os.killpg(cluster.web.pid, 9)
        cluster.web.wait()
        cluster.web = None


def _one_message_sent(cluster: Any, name: str) -> tuple[str, dict[str, str]]:
    """A topic `name` with one message for the consumer group `name`-c; (api, headers)."""
    token = cluster.manage("create_token", name, "--scope", "admin").split()[0]
    headers = {"Authorization": f"Bearer {token}"}
    api = f"{cluster.base}/api/v1"
    for path, payload in [
        ("/topics", {"name": name, "queues": 1}),
        ("/producer-groups", {"name": f"{name}-p", "check_url": "http://127.0.0.1:9/c"}),
        ("/consumer-groups", {"name": f"{name}-c"}),
    ]:
        assert requests.post(api + path, json=payload, headers=headers, timeout=10).ok
    sent = {"producer_group": f"{name}-p", "body": "one"}
    first = requests.post(f"{api}/topics/{name}/messages", json=sent, headers=headers, timeout=10)
    assert first.ok, first.text
    return api, headers


def test_only_receives_are_answered_before_a_standby_has_them(private_cluster: Any) -> None:
    cluster = private_cluster
    with _web(cluster):
        api, headers = _one_message_sent(cluster, "sync-rep")
        sent = {"producer_group": "sync-rep-p", "body": "one"}

        _wait_for_a_standby(cluster, "a_standby_that_never_comes")
        with pytest.raises(requests.Timeout):  # a send waits for the standby
            requests.post(
                f"{api}/topics/sync-rep/messages", json=sent, headers=headers, timeout=1.5
            )
        started = time.monotonic()
        received = requests.post(
            f"{api}/consumer-groups/sync-rep-c/receive",
            json={"topic": "sync-rep", "max_messages": 1},
            headers=headers,
            timeout=10,
        )
        assert received.status_code == 200, received.text
        assert time.monotonic() - started < 2  # a receive does not wait
        [message] = received.json()["messages"]
        with pytest.raises(requests.Timeout):  # an ack does
            requests.post(
                f"{api}/consumer-groups/sync-rep-c/ack",
                json={"receipt_handles": [message["receipt_handle"]]},
                headers=headers,
                timeout=1.5,
            )


def test_on_a_cluster_a_receive_waits_for_a_standby_too(private_cluster: Any) -> None:
    """TXHUB_RECEIVE_SYNCHRONOUS_COMMIT (on by default for a multi-host URL; decision 0050): a
    receive is answered only once a standby has it, so a primary that lost its lock and wakes
    up cannot hand out a message. The test above, on the same server, is its positive control."""
    cluster = private_cluster
    with _web(cluster, TXHUB_RECEIVE_SYNCHRONOUS_COMMIT="1"):
        api, headers = _one_message_sent(cluster, "sync-recv")
        receive = {"topic": "sync-recv", "max_messages": 1, "invisible_seconds": 10}
        _wait_for_a_standby(cluster, "a_standby_that_never_comes")
        with pytest.raises(requests.Timeout):  # the receive waits for the standby
            requests.post(
                f"{api}/consumer-groups/sync-recv-c/receive",
                json=receive,
                headers=headers,
                timeout=1.5,
            )
