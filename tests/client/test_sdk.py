"""The Python SDK (client/, txhub_client) against the real server (gunicorn)."""

import itertools
import json
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import psycopg
import pytest
import requests
from django.test import RequestFactory
from txhub_client import (
    Barrier,
    BarrierRolledBack,
    CheckbackApp,
    LocalTransactionState,
    Message,
    Producer,
    SimpleConsumer,
    TransactionProducer,
    TxhubError,
    django_check_view,
    verify_signature,
)

from apps.broker.models import HalfMessage
from apps.broker.services import callbacks
from tests.conftest import Server, db_url_for_tests
from tests.support.responses import expect
from tests.support.sdk import Listener


def consumer(shop: dict[str, Any]) -> SimpleConsumer:
    return SimpleConsumer(shop["url"], shop["token"], "billing", topic="orders")


def test_transaction_producer_commits_rolls_back_and_leaves_unknown_to_check_back(
    shop: Any,
) -> None:
    outcomes = {
        "c": LocalTransactionState.COMMIT_MESSAGE,
        "r": LocalTransactionState.ROLLBACK_MESSAGE,
        "u": LocalTransactionState.UNKNOW,
    }

    def decide(message: Message, arg: Any) -> LocalTransactionState:
        if arg == "boom":
            raise RuntimeError("local database down")
        return outcomes[arg]

    producer = TransactionProducer(shop["url"], shop["token"], "shop", Listener(decide))
    results = {
        arg: producer.send_message_in_transaction(Message("orders", f"order {arg}"), arg)
        for arg in ("c", "r", "u", "boom")
    }
    assert results["c"].state == "COMMITTED"
    assert results["c"].queue_offset is not None
    assert results["r"].state == "ROLLED_BACK"
    assert results["u"].state == "PREPARED"
    assert results["boom"].state == "PREPARED"
    assert isinstance(results["boom"].error, RuntimeError)
    assert results["boom"].local_transaction_state is LocalTransactionState.UNKNOW
    received = consumer(shop).receive(wait_seconds=1)
    assert [m.body for m in received] == ["order c"]
    assert received[0].transaction_id == results["c"].transaction_id


def test_producer_sends_normal_binary_and_delayed_messages(shop: Any) -> None:
    producer = Producer(shop["url"], shop["token"], "shop")
    plain = producer.send(Message("orders", "hello", tags="TagA", keys=["k"]))
    binary = producer.send(Message("orders", b"\x00\xff"))
    delayed = producer.send(
        Message("orders", "later", deliver_at=datetime.now(UTC) + timedelta(hours=1))
    )
    assert plain.queue_offset is not None
    assert delayed.queue_offset is None
    got = {m.msg_id: m for m in consumer(shop).receive()}
    assert got[plain.msg_id].body == "hello"
    assert got[plain.msg_id].tags == "TagA"
    assert got[binary.msg_id].body == b"\x00\xff"
    assert delayed.msg_id not in got


def test_batches_send_prepare_and_end_with_one_outcome_per_transaction(shop: Any) -> None:
    producer = TransactionProducer(
        shop["url"], shop["token"], "shop", Listener(lambda m, a: LocalTransactionState.UNKNOW)
    )
    sent = producer.send_batch([Message("orders", f"plain {n}", keys=[str(n)]) for n in range(3)])
    assert all(result.queue_offset is not None for result in sent)
    halves = producer.prepare_batch([Message("orders", f"tx {n}") for n in range(3)])
    ids = [str(m.transaction_id) for m in halves]
    rolled = producer.end_batch(ids[2:], commit=False)
    assert [(o.status, o.state) for o in rolled] == [(200, "ROLLED_BACK")]
    ended = producer.end_batch(ids, commit=True)
    assert [(o.transaction_id, o.status, o.state) for o in ended[:2]] == [
        (ids[0], 200, "COMMITTED"),
        (ids[1], 200, "COMMITTED"),
    ]
    assert ended[2].status == 409
    assert ended[2].error is not None
    assert ended[2].error.code == "transaction_resolved"
    bodies = sorted(m.body for m in consumer(shop).receive(max_messages=32, wait_seconds=1))
    assert bodies == ["plain 0", "plain 1", "plain 2", "tx 0", "tx 1"]
    with pytest.raises(ValueError, match="one topic"):
        producer.send_batch([Message("orders", "a"), Message("elsewhere", "b")])


def test_errors_come_back_as_txhub_errors(shop: Any) -> None:
    producer = Producer(shop["url"], shop["token"], "shop")
    with pytest.raises(TxhubError) as raised:
        producer.send(Message("orders", ""))
    assert (raised.value.status, raised.value.code) == (400, "invalid_request")
    with pytest.raises(TxhubError) as raised:
        producer.send(Message("nope", "x"))
    assert raised.value.code == "not_found"


def test_simple_consumer_acks_after_the_handler_and_not_when_it_fails(
    shop: Any, server: Server
) -> None:
    topic = requests.post(
        server.url("/api/v1/topics"),
        json={"name": "single", "queues": 1},
        headers=server.token("admin"),
        timeout=10,
    )
    expect(topic, 201)
    producer = Producer(shop["url"], shop["token"], "shop")
    for body in ("fail", "ok"):
        producer.send(Message("single", body))
    c = SimpleConsumer(shop["url"], shop["token"], "billing", topic="single")
    handled: list[str] = []

    def handler(message: Any) -> None:
        handled.append(message.body)
        if message.body == "fail":
            raise ValueError("cannot handle")

    acked = [m.body for m in itertools.islice(c.messages(handler, wait_seconds=1), 1)]
    assert acked == ["ok"]
    assert handled == ["fail", "ok"]
    status = expect(
        requests.get(
            f"{shop['url']}/api/v1/consumer-groups/billing",
            headers={"Authorization": f"Bearer {shop['token']}"},
            timeout=10,
        ),
        200,
    )
    assert sum(q["in_flight"] for q in status["queues"]) == 1  # "fail" waits to come back


def test_change_invisible_duration_returns_a_new_handle(shop: Any) -> None:
    Producer(shop["url"], shop["token"], "shop").send(Message("orders", "x"))
    c = consumer(shop)
    [message] = c.receive()
    changed = c.change_invisible_duration(message, 120)
    assert changed.receipt_handle != message.receipt_handle
    assert c.ack([message, changed]) == ([changed.receipt_handle], [message.receipt_handle])


def serve(app: Any) -> tuple[str, Any]:
    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    httpd = make_server("127.0.0.1", 0, app, handler_class=Quiet)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{httpd.server_port}/", httpd


def test_the_wsgi_receiver_answers_txhubs_signed_check_and_refuses_a_bad_signature(
    shop: Any,
) -> None:
    listener = Listener(lambda m, a: LocalTransactionState.UNKNOW)
    url, httpd = serve(CheckbackApp(listener, shop["secret"]))
    try:
        producer = TransactionProducer(shop["url"], shop["token"], "shop", listener)
        result = producer.send_message_in_transaction(Message("orders", "x"))
        HalfMessage.objects.filter(transaction_id=result.transaction_id).update(
            producer_group=HalfMessage.objects.get(
                transaction_id=result.transaction_id
            ).producer_group
        )
        from apps.broker.models import ProducerGroup

        ProducerGroup.objects.filter(name="shop").update(check_url=url)
        half = HalfMessage.objects.select_related("producer_group", "topic").get(
            transaction_id=result.transaction_id
        )
        outcome = callbacks.call_check_url(half)
        assert (outcome.answer, outcome.status) == ("COMMIT", 200)
        assert listener.checked == [result.transaction_id]
        forged = requests.post(
            url,
            data=b"{}",
            timeout=5,
            headers={
                "webhook-id": "msg_x",
                "webhook-timestamp": str(int(time.time())),
                "webhook-signature": "v1,AAAA",
            },
        )
        assert forged.status_code == 401
        assert listener.checked == [result.transaction_id]
    finally:
        httpd.shutdown()


def test_signatures_outside_the_timestamp_tolerance_are_refused() -> None:
    import base64
    import hashlib
    import hmac

    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    body, ts = b'{"a":1}', int(time.time())
    sig = base64.b64encode(
        hmac.new(b"k" * 32, f"id.{ts}.".encode() + body, hashlib.sha256).digest()
    ).decode()
    headers = {"webhook-id": "id", "webhook-timestamp": str(ts), "webhook-signature": f"v1,{sig}"}
    verify_signature(secret, headers, body)
    verify_signature(["whsec_" + base64.b64encode(b"o" * 32).decode(), secret], headers, body)
    with pytest.raises(Exception, match="tolerance"):
        verify_signature(secret, headers, body, now=ts + 301)
    with pytest.raises(Exception, match="no signature"):
        verify_signature(secret, headers, body + b" ")


def test_the_django_view_answers_a_check(shop: Any) -> None:
    listener = Listener(lambda m, a: LocalTransactionState.UNKNOW)
    view = django_check_view(listener, shop["secret"])
    payload = json.dumps(
        {
            "transaction_id": "t1",
            "msg_id": "M",
            "producer_group": "shop",
            "topic": "orders",
            "tags": None,
            "keys": [],
            "properties": {},
            "body": "x",
            "born_at": "",
            "check_times": 0,
        }
    ).encode()
    ts = int(time.time())
    sig = callbacks.signature(shop["secret"], "msg_1", ts, payload)
    request = RequestFactory().post(
        "/check",
        data=payload,
        content_type="application/json",
        headers={"webhook-id": "msg_1", "webhook-timestamp": str(ts), "webhook-signature": sig},
    )
    response = view(request)
    assert response.status_code == 200
    assert json.loads(response.content) == {"state": "COMMIT"}
    assert (
        view(
            RequestFactory().post("/check", data=payload, content_type="application/json")
        ).status_code
        == 401
    )


def barrier_connections(tmp_path: Path) -> list[Any]:
    pg = psycopg.connect(db_url_for_tests())
    lite = sqlite3.connect(tmp_path / "shop.db", timeout=10)
    return [pg, lite]


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_the_barrier_answers_from_the_local_record_and_fences_a_late_commit(
    transactional_db: None, tmp_path: Path, kind: str
) -> None:
    connection = barrier_connections(tmp_path)[0 if kind == "postgres" else 1]
    barrier = Barrier()
    barrier.create_table(connection)
    barrier.record_commit(connection, "tx-committed")
    connection.commit()
    assert barrier.check(connection, "tx-committed") == "COMMIT"
    assert barrier.check(connection, "tx-unknown") == "ROLLBACK"  # no record: rollback marker
    with pytest.raises(BarrierRolledBack):
        barrier.record_commit(connection, "tx-unknown")  # the late local commit must fail
    connection.rollback()
    assert barrier.check(connection, "tx-unknown") == "ROLLBACK"
    connection.cursor().execute("DROP TABLE txhub_barrier")
    connection.commit()
    connection.close()


def test_the_barrier_check_waits_for_a_running_local_transaction_on_postgres(
    transactional_db: None,
) -> None:
    barrier = Barrier()
    local, checker_conn = psycopg.connect(db_url_for_tests()), psycopg.connect(db_url_for_tests())
    barrier.create_table(local)
    barrier.record_commit(local, "tx-running")  # inside the still-open local transaction
    answers: list[str] = []
    checker_pid = checker_conn.info.backend_pid

    def waiting_on_a_lock() -> bool:
        with psycopg.connect(db_url_for_tests()) as watcher:
            row = watcher.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (checker_pid,)
            ).fetchone()
        return row is not None and row[0] == "Lock"

    with ThreadPoolExecutor(1) as pool:
        check = pool.submit(lambda: answers.append(barrier.check(checker_conn, "tx-running")))
        # The positive control: the check has reached Postgres and waits there on a lock (the
        # row the local transaction holds), rather than not having run yet.
        deadline = time.monotonic() + 30
        while not waiting_on_a_lock() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert waiting_on_a_lock()
        assert answers == []  # the check waits on the row the local transaction holds
        assert not check.done()
        local.commit()
        check.result(timeout=10)
    assert answers == ["COMMIT"]
    local.cursor().execute("DROP TABLE txhub_barrier")
    local.commit()
    local.close()
    checker_conn.close()


def test_a_text_body_of_4_mib_in_any_script_is_sent_whole(shop: dict[str, Any]) -> None:
    """The contract's 4 MiB is the decoded body; the SDK sends text as UTF-8, not as \\u escapes
    that would take it past the request's 8 MiB cap on the wire."""
    producer = Producer(shop["url"], shop["token"], "shop")
    widest = "中" * (4 * 1024 * 1024 // 3)  # 3 bytes each in UTF-8, 6 as a \\u escape
    sent = producer.send(Message("orders", widest))
    got = requests.get(
        f"{shop['url']}/api/v1/messages/{sent.msg_id}",
        headers={"Authorization": f"Bearer {shop['token']}"},
        timeout=30,
    )
    assert expect(got, 200)["body"] == widest
    # Positive control: one byte over the decoded limit is still refused.
    with pytest.raises(TxhubError) as refused:
        producer.send(Message("orders", widest + "a" * (4 * 1024 * 1024 - len(widest) * 3 + 1)))
    assert refused.value.status == 413
