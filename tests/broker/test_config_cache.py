"""The configuration cache (docs/decisions/0026): tokens, groups, topics and bindings kept per web
process under a shared epoch. A request that the cache answers asks Postgres nothing about them;
every change through txhub holds at once; a change made behind txhub's back holds within
TXHUB_CONFIG_CACHE_SECONDS; without Redis nothing is cached and every answer stays right."""

import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from apps.broker import config_cache, selectors
from apps.broker.models import ApiToken, AuditAction, AuditRecord, ConsumerGroup
from apps.broker.services import registry
from tests.support.redis_outage import epoch_once_redis_is_asked_again, shared_cache_unreachable
from tests.support.responses import assert_error, expect

CONFIG_TABLES = (
    "broker_apitoken",
    "broker_topic",
    "broker_producergroup",
    "broker_consumergroup",
    "_topics",  # the binding tables
)


def config_queries(captured: CaptureQueriesContext) -> list[str]:
    return [
        q["sql"] for q in captured.captured_queries if any(t in q["sql"] for t in CONFIG_TABLES)
    ]


def send(client: APIClient, names: dict[str, Any], topic: str | None = None) -> Any:
    return client.post(
        f"/api/v1/topics/{topic or names['topic']}/messages",
        {"producer_group": names["producer"], "body": "x"},
        format="json",
    )


def receive(client: APIClient, names: dict[str, Any], topic: str | None = None) -> Any:
    return client.post(
        f"/api/v1/consumer-groups/{names['consumer']}/receive",
        {"topic": topic or names["topic"]},
        format="json",
    )


def producer_of(names: dict[str, Any]) -> tuple[APIClient, int]:
    """A client with a new token for the producer group, and the token's id."""
    token, raw = registry.token_create(name="producer", scopes=[f"produce:{names['producer']}"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client, token.pk


def test_a_request_the_cache_answers_reads_no_token_group_topic_or_binding(
    api: APIClient, setup_topic: Any
) -> None:
    names = setup_topic()
    expect(send(api, names), 201)
    expect(receive(api, names), 200)
    with CaptureQueriesContext(connection) as captured:
        expect(send(api, names), 201)
        expect(receive(api, names), 200)
    queries = config_queries(captured)
    # A receive that takes a message locks its group's row against a deletion (decision 0088):
    # one lock by the group's id, which reads nothing the cache keeps; nothing else may be there.
    locks = [q for q in queries if "FROM broker_consumergroup WHERE id = " in q]
    assert len(locks) == 1, locks
    assert locks[0].endswith(" FOR KEY SHARE")
    assert [q for q in queries if q not in locks] == []
    assert captured.captured_queries  # the send itself was stored


def test_without_the_cache_every_request_reads_them(api: APIClient, setup_topic: Any) -> None:
    # The test above can fail: the same requests with the cache off read all four.
    names = setup_topic()
    expect(send(api, names), 201)
    with override_settings(TXHUB_CONFIG_CACHE_SECONDS=0), CaptureQueriesContext(connection) as c:
        expect(send(api, names), 201)
    read = " ".join(config_queries(c))
    for table in ("broker_apitoken", "broker_topic", "broker_producergroup", "_topics"):
        assert table in read


def test_a_revoked_token_fails_at_once(api: APIClient, setup_topic: Any) -> None:
    names = setup_topic()
    producer, token = producer_of(names)
    expect(send(producer, names), 201)  # known to the cache now
    expect(api.delete(f"/api/v1/tokens/{token}"), 204)
    assert_error(send(producer, names), 401, "unauthenticated")


def test_a_revocation_rolled_back_changes_nothing(setup_topic: Any) -> None:
    names = setup_topic()
    producer, token = producer_of(names)
    expect(send(producer, names), 201)
    with pytest.raises(RuntimeError, match="rolled back"):
        revoke_then_fail(token)
    expect(send(producer, names), 201)


@transaction.atomic
def revoke_then_fail(token_id: int) -> None:
    registry.token_revoke(token_id=token_id)
    raise RuntimeError("rolled back")


def test_a_binding_holds_at_once(api: APIClient, setup_topic: Any) -> None:
    names = setup_topic()
    setup_topic(topic="refunds", producer="p2", consumer="c2")
    expect(send(api, names), 201)
    expect(receive(api, names), 200)  # unbound, kept as such
    for kind, group in (("producer", names["producer"]), ("consumer", names["consumer"])):
        expect(
            api.put(f"/api/v1/{kind}-groups/{group}/topics", {"topics": ["refunds"]}, "json"), 200
        )
    assert_error(send(api, names), 403, "forbidden")
    assert_error(receive(api, names), 403, "forbidden")
    expect(send(api, names, topic="refunds"), 201)


def kept_group(name: str) -> ConsumerGroup:
    """What this process keeps for the group under the epoch now (the lambda loads nothing)."""
    kept = config_cache.read(config_cache.current(), ("consumer_group", name), lambda: None)
    assert isinstance(kept, ConsumerGroup)
    return kept


def test_a_group_change_holds_at_once(api: APIClient, setup_topic: Any) -> None:
    names = setup_topic()
    expect(receive(api, names), 200)
    assert kept_group(names["consumer"]).max_delivery_attempts == 16
    registry.consumer_group_update(name=names["consumer"], max_delivery_attempts=3)
    expect(receive(api, names), 200)
    assert kept_group(names["consumer"]).max_delivery_attempts == 3


def test_each_caller_gets_its_own_copy_of_a_kept_group(setup_topic: Any) -> None:
    names = setup_topic()
    epoch = config_cache.current()
    first = selectors.consumer_group_get(name=names["consumer"], epoch=epoch)
    first.max_delivery_attempts = 999  # a caller that changes what it got
    again = selectors.consumer_group_get(name=names["consumer"], epoch=epoch)
    assert again.max_delivery_attempts == 16
    assert again == ConsumerGroup.objects.get(name=names["consumer"])


@override_settings(TXHUB_CONFIG_CACHE_SECONDS=1.0)
def test_a_change_behind_txhubs_back_holds_within_the_cache_time(setup_topic: Any) -> None:
    names = setup_topic()
    producer, token = producer_of(names)
    expect(send(producer, names), 201)
    # An UPDATE no service made (psql by hand): no signal, no new epoch.
    ApiToken.objects.filter(pk=token).update(revoked_at=timezone.now())
    time.sleep(1.1)  # TXHUB_CONFIG_CACHE_SECONDS, and a margin
    assert_error(send(producer, names), 401, "unauthenticated")


def test_a_scheduled_revocation_holds_from_its_time(setup_topic: Any) -> None:
    names = setup_topic()
    producer, token = producer_of(names)
    ApiToken.objects.filter(pk=token).update(revoked_at=timezone.now() + timedelta(seconds=0.5))
    config_cache.changed()
    expect(send(producer, names), 201)  # cached with its revocation time
    time.sleep(0.6)
    assert_error(send(producer, names), 401, "unauthenticated")


def test_revoking_a_token_scheduled_for_revocation_revokes_it_now(
    api: APIClient, setup_topic: Any
) -> None:
    """A revocation scheduled for later does not make the token's DELETE a no-op: the token is
    refused from the 204 on, and the revocation is recorded (decision 0108)."""
    names = setup_topic()
    producer, token = producer_of(names)
    ApiToken.objects.filter(pk=token).update(revoked_at=timezone.now() + timedelta(hours=1))
    config_cache.changed()
    expect(send(producer, names), 201)  # scheduled, not yet revoked
    expect(api.delete(f"/api/v1/tokens/{token}"), 204)
    assert_error(send(producer, names), 401, "unauthenticated")
    revoked_at = ApiToken.objects.get(pk=token).revoked_at
    assert revoked_at is not None
    assert revoked_at <= timezone.now()
    audit = AuditRecord.objects.filter(action=AuditAction.TOKEN_REVOKE, target="producer")
    assert audit.count() == 1
    # Revoking it again changes nothing and records nothing (decision 0039).
    expect(api.delete(f"/api/v1/tokens/{token}"), 204)
    assert ApiToken.objects.get(pk=token).revoked_at == revoked_at
    assert audit.count() == 1


def test_without_redis_nothing_is_cached_and_no_change_is_made_unknown(
    api: APIClient, setup_topic: Any
) -> None:
    names = setup_topic()
    producer, token = producer_of(names)
    # An earlier outage's pause must not answer for the one below: Redis is asked again first.
    epoch_once_redis_is_asked_again()
    expect(send(producer, names), 201)  # kept by this process under the live epoch
    with shared_cache_unreachable():  # a port held and refused: nothing else can take it
        assert config_cache.current() is None
        with CaptureQueriesContext(connection) as captured:
            expect(send(producer, names), 201)
        assert any("broker_apitoken" in sql for sql in config_queries(captured))
        # Other processes could not be told: the revocation is refused and rolled back, so it
        # never answers 204 while some process still takes the token.
        assert_error(api.delete(f"/api/v1/tokens/{token}"), 503, "unavailable")
        assert ApiToken.objects.get(pk=token).revoked_at is None
        bind = {"topics": [names["topic"]]}
        path = f"/api/v1/consumer-groups/{names['consumer']}/topics"
        assert_error(api.put(path, bind, format="json"), 503, "unavailable")
        assert not ConsumerGroup.objects.get(name=names["consumer"]).topics.exists()
        expect(send(producer, names), 201)
    epoch_once_redis_is_asked_again()  # the outage's pause is over: the cache is used again
    expect(send(producer, names), 201)
    expect(api.delete(f"/api/v1/tokens/{token}"), 204)
    assert_error(send(producer, names), 401, "unauthenticated")
