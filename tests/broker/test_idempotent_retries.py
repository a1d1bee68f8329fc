"""CONTRACT 6, idempotent retries: the same Idempotency-Key with the same request within 24 h
answers the first answer and stores nothing; with a different request it is 409."""

import threading
from datetime import timedelta
from typing import Any

import pytest
import requests
from django.utils import timezone
from rest_framework.test import APIClient

from apps.broker.models import CommitLogEntry, HalfMessage, IdempotencyKey, OpRecord
from apps.broker.services import idempotency, registry
from tests.support.responses import assert_error

SEND = "/api/v1/topics/orders/messages"
MESSAGE = {"producer_group": "order-service", "body": "order 9527 created", "keys": ["9527"]}
PREPARE = {**MESSAGE, "topic": "orders"}


def post(api: APIClient, path: str, payload: dict[str, Any], key: str | None) -> Any:
    headers: dict[str, Any] = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return api.post(path, payload, format="json", **headers)


@pytest.mark.parametrize(
    ("path", "payload", "id_field", "count"),
    [
        (SEND, MESSAGE, "msg_id", CommitLogEntry.objects.count),
        ("/api/v1/transactions", PREPARE, "transaction_id", HalfMessage.objects.count),
    ],
    ids=["send", "prepare"],
)
def test_a_retry_with_the_same_key_answers_the_first_answer_and_stores_nothing(
    api: APIClient, setup_topic: Any, path: str, payload: dict[str, Any], id_field: str, count: Any
) -> None:
    setup_topic()
    first = post(api, path, payload, "order-9527")
    assert first.status_code == 201, first.json()
    assert "Idempotent-Replayed" not in first
    again = post(api, path, {**payload}, "order-9527")
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert again.json()[id_field] == first.json()[id_field]
    assert count() == 1
    # Positive control: a new key stores a new message.
    other = post(api, path, payload, "order-9528")
    assert other.status_code == 201
    assert other.json()[id_field] != first.json()[id_field]
    assert count() == 2


def test_key_order_in_the_json_does_not_make_another_request(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    first = post(api, SEND, MESSAGE, "k1")
    reordered = dict(reversed(list(MESSAGE.items())))
    assert post(api, SEND, reordered, "k1").json()["msg_id"] == first.json()["msg_id"]
    assert CommitLogEntry.objects.count() == 1


def test_the_same_key_with_another_request_is_409_and_stores_nothing(
    api: APIClient, setup_topic: Any
) -> None:
    setup_topic()
    assert post(api, SEND, MESSAGE, "k1").status_code == 201
    response = post(api, SEND, {**MESSAGE, "body": "order 9528 created"}, "k1")
    error = assert_error(response, 409, "conflict")
    assert "Idempotency-Key" in error["message"]
    assert error["details"] == {"idempotency_key": "k1"}
    # The same key on the other endpoint is another request too.
    assert_error(post(api, "/api/v1/transactions", PREPARE, "k1"), 409, "conflict")
    assert CommitLogEntry.objects.count() == 1
    assert HalfMessage.objects.count() == 0


def test_the_same_key_and_body_sent_to_another_topic_is_409_and_stores_nothing(
    api: APIClient, setup_topic: Any
) -> None:
    # The topic is in the path only: a replay of the first answer would name a message the
    # client never sent to the topic it asked for.
    setup_topic()
    assert api.post("/api/v1/topics", {"name": "payments"}, format="json").status_code == 201
    assert post(api, SEND, MESSAGE, "k1").status_code == 201
    response = post(api, "/api/v1/topics/payments/messages", MESSAGE, "k1")
    assert_error(response, 409, "conflict")
    assert list(CommitLogEntry.objects.values_list("topic__name", flat=True)) == ["orders"]


@pytest.mark.parametrize("key", ["", "two words", "k" * 256, "clé", "tab\tkey"])
def test_a_malformed_key_is_400_and_stores_nothing(
    api: APIClient, setup_topic: Any, key: str
) -> None:
    setup_topic()
    for path, payload in ((SEND, MESSAGE), ("/api/v1/transactions", PREPARE)):
        error = assert_error(post(api, path, payload, key), 400, "invalid_request")
        assert "Idempotency-Key" in error["details"]
    assert CommitLogEntry.objects.count() == 0
    assert HalfMessage.objects.count() == 0
    assert IdempotencyKey.objects.count() == 0


def test_keys_belong_to_their_producer_group(api: APIClient, setup_topic: Any) -> None:
    setup_topic()
    registry.producer_group_create(name="other-service", check_url="http://127.0.0.1:9/")
    first = post(api, SEND, MESSAGE, "k1")
    second = post(api, SEND, {**MESSAGE, "producer_group": "other-service"}, "k1")
    assert second.status_code == 201
    assert second.json()["msg_id"] != first.json()["msg_id"]


def test_a_refused_request_keeps_no_key_so_its_retry_runs(api: APIClient, setup_topic: Any) -> None:
    setup_topic()
    missing = post(api, "/api/v1/topics/later/messages", MESSAGE, "k1")
    assert_error(missing, 404, "not_found")
    assert IdempotencyKey.objects.count() == 0
    assert api.post("/api/v1/topics", {"name": "later"}, format="json").status_code == 201
    retried = post(api, "/api/v1/topics/later/messages", MESSAGE, "k1")
    assert retried.status_code == 201
    assert "Idempotent-Replayed" not in retried


def test_a_key_older_than_the_ttl_is_a_new_request(
    api: APIClient, setup_topic: Any, settings: Any
) -> None:
    setup_topic()
    first = post(api, SEND, MESSAGE, "k1")
    old = timezone.now() - timedelta(seconds=settings.TXHUB_IDEMPOTENCY_TTL + 1)
    assert IdempotencyKey.objects.update(created_at=old) == 1
    again = post(api, SEND, MESSAGE, "k1")
    assert again.status_code == 201
    assert again.json()["msg_id"] != first.json()["msg_id"]
    assert CommitLogEntry.objects.count() == 2
    # ... and remembered from now on.
    assert post(api, SEND, MESSAGE, "k1").json()["msg_id"] == again.json()["msg_id"]


def test_a_key_taken_over_after_the_ttl_belongs_to_its_new_request(
    api: APIClient, setup_topic: Any, settings: Any
) -> None:
    """An expired key used for another request stores it, and from then on answers that
    request: its retry is a replay, the first request is now the different one (409)."""
    setup_topic()
    assert post(api, SEND, MESSAGE, "k1").status_code == 201
    old = timezone.now() - timedelta(seconds=settings.TXHUB_IDEMPOTENCY_TTL + 1)
    assert IdempotencyKey.objects.update(created_at=old) == 1
    other = {**MESSAGE, "body": "order 9528 created"}
    taken = post(api, SEND, other, "k1")
    assert taken.status_code == 201, taken.json()
    again = post(api, SEND, other, "k1")
    assert again.status_code == 201, again.json()
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == taken.json()
    assert_error(post(api, SEND, MESSAGE, "k1"), 409, "conflict")
    assert CommitLogEntry.objects.count() == 2


def test_the_sweep_forgets_expired_keys_only(
    api: APIClient, setup_topic: Any, settings: Any
) -> None:
    setup_topic()
    post(api, SEND, MESSAGE, "old")
    post(api, SEND, MESSAGE, "new")
    old = timezone.now() - timedelta(seconds=settings.TXHUB_IDEMPOTENCY_TTL + 1)
    IdempotencyKey.objects.filter(key="old").update(created_at=old)
    assert idempotency.idempotency_sweep() == 1
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["new"]


def test_concurrent_retries_with_one_key_store_once(server: Any) -> None:
    """Eight retries of one prepare at once, on a real gunicorn: one half, one answer for all."""
    admin = server.token("admin")
    for path, payload in [
        ("/api/v1/topics", {"name": "orders"}),
        ("/api/v1/producer-groups", {"name": "order-service", "check_url": "http://127.0.0.1:9/"}),
    ]:
        assert requests.post(server.url(path), json=payload, headers=admin, timeout=10).ok
    headers = {**server.token("produce:order-service"), "Idempotency-Key": "order-9527"}
    barrier = threading.Barrier(8)
    answers: list[requests.Response] = []

    def retry() -> None:
        barrier.wait(timeout=10)
        answers.append(
            requests.post(
                server.url("/api/v1/transactions"), json=PREPARE, headers=headers, timeout=20
            )
        )

    threads = [threading.Thread(target=retry) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(answers) == 8
    assert {a.status_code for a in answers} == {201}
    assert len({a.json()["transaction_id"] for a in answers}) == 1
    assert sum(1 for a in answers if a.headers.get("Idempotent-Replayed") == "true") == 7
    assert HalfMessage.objects.count() == 1
    assert OpRecord.objects.count() == 1
