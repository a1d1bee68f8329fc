"""The life of a transaction over the API (CONTRACT invariants 1, 2, 3)."""

from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.broker.models import CommitLogEntry, OpRecord, Resolver
from apps.broker.services import transactions
from apps.broker.services.transactions import Actor
from tests.support.responses import assert_error, expect
from tests.support.transactions import commit_written


def prepare(api: APIClient, names: dict[str, Any], **extra: Any) -> dict[str, Any]:
    response = api.post(
        "/api/v1/transactions",
        {
            "producer_group": names["producer"],
            "topic": names["topic"],
            "body": "order 9527",
            **extra,
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    return dict(response.json())


def receive(api: APIClient, names: dict[str, Any], **extra: Any) -> list[dict[str, Any]]:
    response = api.post(
        f"/api/v1/consumer-groups/{names['consumer']}/receive",
        {"topic": names["topic"], **extra},
        format="json",
    )
    assert response.status_code == 200, response.json()
    return list(response.json()["messages"])


def test_prepare_answers_prepared_with_ids(api: APIClient, setup_topic: Any) -> None:
    names = setup_topic()
    tx = prepare(api, names, tags="created", keys=["9527"])
    assert tx["state"] == "PREPARED"
    assert len(tx["msg_id"]) == 32
    assert tx["resolved_by"] is None


def test_a_prepared_message_is_never_delivered(api: APIClient, setup_topic: Any) -> None:
    names = setup_topic()
    prepare(api, names)
    assert receive(api, names) == []
    assert CommitLogEntry.objects.count() == 0


def test_a_committed_message_is_delivered_once_with_its_fields(
    api: APIClient, setup_topic: Any
) -> None:
    names = setup_topic()
    tx = prepare(api, names, tags="created", keys=["9527"], properties={"a": "b"})
    response = api.post(f"/api/v1/transactions/{tx['transaction_id']}/commit", format="json")
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == "COMMITTED"
    assert body["resolved_by"] == "PRODUCER"
    assert body["queue_offset"] == 0
    messages = receive(api, names)
    assert [m["msg_id"] for m in messages] == [tx["msg_id"]]
    message = messages[0]
    assert message["body"] == "order 9527"
    assert "body_base64" not in message
    assert message["tags"] == "created"
    assert message["keys"] == ["9527"]
    assert message["properties"] == {"a": "b"}
    assert message["transaction_id"] == tx["transaction_id"]
    assert message["queue_offset"] == body["queue_offset"]
    assert CommitLogEntry.objects.filter(transaction_id=tx["transaction_id"]).count() == 1


def test_a_binary_body_comes_back_as_base64(api: APIClient, setup_topic: Any) -> None:
    names = setup_topic()
    response = api.post(
        "/api/v1/transactions",
        {"producer_group": names["producer"], "topic": names["topic"], "body_base64": "AP8A/w=="},
        format="json",
    )
    tx = expect(response, 201)
    expect(api.post(f"/api/v1/transactions/{tx['transaction_id']}/commit", format="json"), 200)
    [message] = receive(api, names)
    assert message["body_base64"] == "AP8A/w=="
    assert "body" not in message


def test_repeating_a_commit_answers_the_same(api: APIClient, setup_topic: Any) -> None:
    names = setup_topic()
    tx = prepare(api, names)
    first = api.post(f"/api/v1/transactions/{tx['transaction_id']}/commit", format="json")
    assert first.status_code == 200
    again = api.post(f"/api/v1/transactions/{tx['transaction_id']}/commit", format="json")
    assert again.status_code == 200
    assert again.json() == first.json()
    assert CommitLogEntry.objects.count() == 1
    assert OpRecord.objects.filter(op="COMMIT").count() == 1


def test_rollback_after_commit_is_refused_and_changes_nothing(
    api: APIClient, setup_topic: Any
) -> None:
    names = setup_topic()
    tx = prepare(api, names)
    expect(api.post(f"/api/v1/transactions/{tx['transaction_id']}/commit", format="json"), 200)
    response = api.post(f"/api/v1/transactions/{tx['transaction_id']}/rollback", format="json")
    error = assert_error(response, 409, "transaction_resolved")
    assert error["details"]["state"] == "COMMITTED"
    detail = expect(api.get(f"/api/v1/transactions/{tx['transaction_id']}"), 200)
    assert detail["state"] == "COMMITTED"
    assert [h["op"] for h in detail["history"]] == ["PREPARE", "COMMIT"]


def test_commit_after_rollback_is_refused(api: APIClient, setup_topic: Any) -> None:
    names = setup_topic()
    tx = prepare(api, names)
    rolled = api.post(
        f"/api/v1/transactions/{tx['transaction_id']}/rollback", {"reason": "stock"}, format="json"
    )
    assert rolled.status_code == 200
    assert rolled.json()["state"] == "ROLLED_BACK"
    assert rolled.json()["queue_offset"] is None
    again = api.post(f"/api/v1/transactions/{tx['transaction_id']}/rollback", format="json")
    assert expect(again, 200) == rolled.json()
    refused = api.post(f"/api/v1/transactions/{tx['transaction_id']}/commit", format="json")
    assert assert_error(refused, 409, "transaction_resolved")["details"]["state"] == "ROLLED_BACK"
    assert receive(api, names) == []
    assert CommitLogEntry.objects.count() == 0


def test_history_keeps_who_decided_and_why(api: APIClient, setup_topic: Any) -> None:
    names = setup_topic()
    tx = prepare(api, names)
    rolled = api.post(
        f"/api/v1/transactions/{tx['transaction_id']}/rollback",
        {"reason": "out of stock"},
        format="json",
    )
    expect(rolled, 200)
    history = expect(api.get(f"/api/v1/transactions/{tx['transaction_id']}"), 200)["history"]
    assert [(h["op"], h["source"], h["reason"]) for h in history] == [
        ("PREPARE", "PRODUCER", ""),
        ("ROLLBACK", "PRODUCER", "out of stock"),
    ]
    assert history[0]["actor"] == "admin-test"


def test_a_parked_transaction_is_resumed_with_its_check_count_reset(
    api: APIClient, setup_topic: Any
) -> None:
    names = setup_topic()
    tx = prepare(api, names)
    transactions.transaction_park(
        transaction_id=tx["transaction_id"], actor=Actor(Resolver.SYSTEM), reason="gave up"
    )
    listed = api.get("/api/v1/transactions", {"state": "PARKED"}).json()
    assert [t["transaction_id"] for t in listed["results"]] == [tx["transaction_id"]]
    response = api.post(f"/api/v1/transactions/{tx['transaction_id']}/resume", format="json")
    assert response.status_code == 200
    assert response.json()["state"] == "PREPARED"
    assert response.json()["check_times"] == 0
    assert [h["op"] for h in response.json()["history"]] == ["PREPARE", "PARK", "RESUME"]
    again = api.post(f"/api/v1/transactions/{tx['transaction_id']}/resume", format="json")
    assert assert_error(again, 409, "conflict")["details"]["state"] == "PREPARED"


def test_a_parked_transaction_can_still_be_committed(api: APIClient, setup_topic: Any) -> None:
    names = setup_topic()
    tx = prepare(api, names)
    transactions.transaction_park(
        transaction_id=tx["transaction_id"], actor=Actor(Resolver.SYSTEM), reason="gave up"
    )
    response = api.post(f"/api/v1/transactions/{tx['transaction_id']}/commit", format="json")
    assert expect(response, 200)["state"] == "COMMITTED"
    assert len(receive(api, names)) == 1


def test_resume_needs_the_admin_scope(make_client: Any, api: APIClient, setup_topic: Any) -> None:
    names = setup_topic()
    tx = prepare(api, names)
    producer = make_client(f"produce:{names['producer']}")
    response = producer.post(f"/api/v1/transactions/{tx['transaction_id']}/resume", format="json")
    assert_error(response, 403, "forbidden")


def test_list_filters_by_state_and_age(api: APIClient, setup_topic: Any) -> None:
    names = setup_topic()
    pending = prepare(api, names)
    done = prepare(api, names)
    expect(api.post(f"/api/v1/transactions/{done['transaction_id']}/commit", format="json"), 200)
    page = api.get(
        "/api/v1/transactions", {"producer_group": names["producer"], "state": "PREPARED"}
    )
    assert [t["transaction_id"] for t in page.json()["results"]] == [pending["transaction_id"]]
    assert page.json()["count"] == 1
    old = api.get("/api/v1/transactions", {"older_than_seconds": 3600}).json()
    assert old["count"] == 0
    everything = api.get("/api/v1/transactions", {"page_size": 1}).json()
    assert everything["count"] == 2
    assert len(everything["results"]) == 1
    assert everything["next"]


def test_message_lookup_traces_half_ops_position_and_deliveries(
    api: APIClient, setup_topic: Any
) -> None:
    names = setup_topic()
    tx = prepare(api, names)
    half_only = api.get(f"/api/v1/messages/{tx['msg_id']}").json()
    assert half_only["transaction"]["state"] == "PREPARED"
    assert half_only["commit_log"] is None
    expect(api.post(f"/api/v1/transactions/{tx['transaction_id']}/commit", format="json"), 200)
    [message] = receive(api, names)
    trace = api.get(f"/api/v1/messages/{tx['msg_id']}").json()
    assert [h["op"] for h in trace["transaction"]["history"]] == ["PREPARE", "COMMIT"]
    assert trace["commit_log"]["queue_offset"] == message["queue_offset"]
    assert trace["deliveries"][0]["consumer_group"] == names["consumer"]
    assert trace["deliveries"][0]["state"] == "INFLIGHT"
    assert trace["body"] == "order 9527"


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_one_final_op_per_transaction_is_enforced_by_the_database(
    api: APIClient, setup_topic: Any, outcome: str
) -> None:
    """The unique index behind invariant 2: even a bypassing writer cannot add a second final op."""
    from django.db import IntegrityError, transaction

    names = setup_topic()
    tx = prepare(api, names)
    expect(api.post(f"/api/v1/transactions/{tx['transaction_id']}/{outcome}", format="json"), 200)
    half_id = OpRecord.objects.get(op="PREPARE").half_id
    with pytest.raises(IntegrityError), transaction.atomic():
        OpRecord.objects.create(half_id=half_id, op="ROLLBACK", source="SYSTEM")


@pytest.mark.django_db(transaction=True)
def test_the_one_statement_commit_writes_what_the_general_path_writes(
    api: APIClient, setup_topic: Any, make_client: Any
) -> None:
    """Outside a caller's transaction a plain commit is one statement (COMMIT_AT_ONCE_SQL);
    inside one it takes the general path (lock, then committing.COMMIT_SQL). Both write the same
    rows and answer the same; offsets stay dense across both."""
    from django.db import transaction as db_transaction

    names = setup_topic(queues=1)
    extra = {"tags": "t", "keys": ["k"], "properties": {"p": "v"}}
    at_once, general = prepare(api, names, **extra), prepare(api, names, **extra)
    producer = make_client(f"produce:{names['producer']}")
    answer = producer.post(
        f"/api/v1/transactions/{at_once['transaction_id']}/commit", {"reason": "r"}, format="json"
    )
    first = expect(answer, 200)
    actor = Actor(Resolver.PRODUCER, "test-producer")
    with db_transaction.atomic():
        resolution = transactions.transaction_commit(
            transaction_id=general["transaction_id"], actor=actor, reason="r"
        )
    assert resolution.entry is not None
    assert first["state"] == "COMMITTED"
    assert (first["queue_offset"], resolution.entry.queue_offset) == (0, 1)
    one = commit_written(at_once["transaction_id"])
    other = commit_written(general["transaction_id"])
    assert one[:-3] == other[:-3]  # actor names differ (token name vs "test-producer")
    assert one[-2:] == other[-2:] == ("r", {})


@pytest.mark.django_db(transaction=True)
def test_what_is_not_a_plain_commit_falls_back_and_answers_as_before(
    api: APIClient, setup_topic: Any, make_client: Any
) -> None:
    """Outside any transaction: a repeated commit (200, nothing written), a commit after a
    rollback (409), another group's transaction (404), a delayed commit (no offset until due),
    a parked one (committed) - each with nothing written by the one-statement attempt."""
    names = setup_topic()
    api.post(
        "/api/v1/producer-groups",
        {"name": "other-shop", "check_url": "http://127.0.0.1:9/"},
        format="json",
    )
    producer = make_client(f"produce:{names['producer']}")
    plain = prepare(api, names)["transaction_id"]
    expect(producer.post(f"/api/v1/transactions/{plain}/commit", {}, format="json"), 200)
    again = expect(producer.post(f"/api/v1/transactions/{plain}/commit", {}, format="json"), 200)
    assert again["state"] == "COMMITTED"
    rolled = prepare(api, names)["transaction_id"]
    expect(producer.post(f"/api/v1/transactions/{rolled}/rollback", {}, format="json"), 200)
    assert_error(
        producer.post(f"/api/v1/transactions/{rolled}/commit", {}, format="json"),
        409,
        "transaction_resolved",
    )
    foreign = expect(
        api.post(
            "/api/v1/transactions",
            {"producer_group": "other-shop", "topic": names["topic"], "body": "x"},
            format="json",
        ),
        201,
    )["transaction_id"]
    assert_error(
        producer.post(f"/api/v1/transactions/{foreign}/commit", {}, format="json"), 404, "not_found"
    )
    delayed = prepare(api, names, delay_level=3)["transaction_id"]
    later = expect(producer.post(f"/api/v1/transactions/{delayed}/commit", {}, format="json"), 200)
    assert later["queue_offset"] is None
    assert later["deliver_at"] is not None
    parked = prepare(api, names)["transaction_id"]
    transactions.transaction_park(
        transaction_id=parked, actor=Actor(Resolver.CHECK_BACK, ""), reason="gave up"
    )
    resumed = expect(producer.post(f"/api/v1/transactions/{parked}/commit", {}, format="json"), 200)
    assert resumed["state"] == "COMMITTED"
    assert CommitLogEntry.objects.count() == 2  # the plain and the parked one, once each
    assert OpRecord.objects.filter(op="COMMIT").count() == 3  # plain, delayed, parked
    assert OpRecord.objects.filter(op="ROLLBACK").count() == 1
