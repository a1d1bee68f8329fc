"""A signed gRPC call is taken only when its signature is the whole HMAC of its own date header
under its own access key's secret (docs/decisions/0022, 0035, 0108): hand-built `authorization`
headers that differ from a good one in one part each are UNAUTHORIZED, and the good one (also in
upper-case hex, which the header's grammar allows) is OK. The date's bound is held on both sides
to the second, by building the header's date, never by waiting; and with the bound set to 0
(off) any date is taken, but the header itself is still required and bounded."""

import hashlib
import hmac
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.services import credentials, registry
from tests.grpc.conftest import GrpcServer, own_server

pytestmark = pytest.mark.e2e

TOPIC = "signed-whole"
SKEW = 900  # TXHUB_GRPC_SIGNATURE_MAX_SKEW_SECONDS's default (docs/configuration.md)


def date_of(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def signature_of(secret_key: str, date_time: str) -> str:
    """RocketMQ 5's MQv2-HMAC-SHA1, computed here rather than by the client's code."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def metadata(access_key: str, date_time: str | None, signature: str) -> list[tuple[str, str]]:
    meta = [
        ("x-mq-client-id", "signature-whole-test"),
        (
            "authorization",
            f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, "
            f"Signature={signature}",
        ),
    ]
    return meta if date_time is None else [("x-mq-date-time", date_time), *meta]


def route_code(server: GrpcServer, meta: list[tuple[str, str]]) -> int:
    with grpc.insecure_channel(server.endpoint) as channel:
        answer: Any = MessagingServiceStub(channel).QueryRoute(
            rpc.QueryRouteRequest(topic=pb.Resource(name=TOPIC)), metadata=meta
        )
    return int(answer.status.code)


@pytest.fixture
def keys(transactional_db: None) -> dict[str, str]:
    registry.topic_create(name=TOPIC, queues=1)
    return credentials.of(registry.token_create(name="signer", scopes=["admin"])[0])


def _flipped_last_digit(signature: str) -> str:
    return signature[:-1] + ("0" if signature[-1] != "0" else "1")


def test_only_the_whole_signature_of_the_header_under_the_keys_own_secret_is_taken(
    grpc_server: GrpcServer, keys: dict[str, str]
) -> None:
    other = credentials.of(registry.token_create(name="other signer", scopes=["admin"])[0])
    access_key, secret_key = keys["access_key"], keys["secret_key"]
    now = datetime.now(UTC)
    date_time = date_of(now)
    good = signature_of(secret_key, date_time)
    cases = {
        "the good signature": (metadata(access_key, date_time, good), pb.OK),
        "in upper-case hex": (metadata(access_key, date_time, good.upper()), pb.OK),
        "its last digit changed": (
            metadata(access_key, date_time, _flipped_last_digit(good)),
            pb.UNAUTHORIZED,
        ),
        "another token's secret": (
            metadata(access_key, date_time, signature_of(other["secret_key"], date_time)),
            pb.UNAUTHORIZED,
        ),
        "another token's access key": (
            metadata(other["access_key"], date_time, good),
            pb.UNAUTHORIZED,
        ),
        "another second's signature": (
            metadata(
                access_key,
                date_time,
                signature_of(secret_key, date_of(now - timedelta(seconds=1))),
            ),
            pb.UNAUTHORIZED,
        ),
        "another minute's signature, the same day": (
            metadata(
                access_key,
                date_time,
                signature_of(secret_key, date_of(now - timedelta(minutes=1))),
            ),
            pb.UNAUTHORIZED,
        ),
    }
    # One character after the signature's 40 hex digits: the header is not the grammar's.
    trailing = metadata(access_key, date_time, good)
    trailing[-1] = (trailing[-1][0], trailing[-1][1] + "0")
    cases["a 41st digit"] = (trailing, pb.UNAUTHORIZED)
    outcomes = {name: route_code(grpc_server, meta) for name, (meta, _) in cases.items()}
    assert outcomes == {name: code for name, (_, code) in cases.items()}


@pytest.mark.parametrize(
    ("seconds", "code"),
    [
        (-(SKEW + 2), pb.UNAUTHORIZED),
        (-(SKEW - 2), pb.OK),
        (SKEW - 2, pb.OK),
        (SKEW + 2, pb.UNAUTHORIZED),
    ],
)
def test_the_dates_bound_holds_to_the_second_on_both_sides(
    grpc_server: GrpcServer, keys: dict[str, str], seconds: int, code: int
) -> None:
    """Two seconds either side of the bound: the header's second is cut from the time it was
    built at, and the call reaches the server well within a second."""
    date_time = date_of(datetime.now(UTC) + timedelta(seconds=seconds))
    meta = metadata(keys["access_key"], date_time, signature_of(keys["secret_key"], date_time))
    assert route_code(grpc_server, meta) == code


@pytest.fixture(scope="module")
def unbounded_server(django_db_setup: None) -> Iterator[GrpcServer]:
    yield from own_server(
        "test-grpc-unbounded-dates.log", {"TXHUB_GRPC_SIGNATURE_MAX_SKEW_SECONDS": "0"}
    )


def test_with_the_bound_off_any_date_is_taken_but_the_header_is_still_required_and_bounded(
    unbounded_server: GrpcServer, keys: dict[str, str]
) -> None:
    secret_key = keys["secret_key"]

    def signed(date_time: str | None) -> list[tuple[str, str]]:
        return metadata(keys["access_key"], date_time, signature_of(secret_key, date_time or ""))

    a_day_ago = date_of(datetime.now(UTC) - timedelta(days=1))
    outcomes = {
        "a day ago": route_code(unbounded_server, signed(a_day_ago)),
        "64 characters": route_code(unbounded_server, signed("7" * 64)),
        "65 characters": route_code(unbounded_server, signed("7" * 65)),
        "no date header": route_code(unbounded_server, signed(None)),
        "an empty date header": route_code(unbounded_server, signed("")),
    }
    assert outcomes == {
        "a day ago": pb.OK,
        "64 characters": pb.OK,
        "65 characters": pb.UNAUTHORIZED,
        "no date header": pb.UNAUTHORIZED,
        "an empty date header": pb.UNAUTHORIZED,
    }
