"""The console and the gRPC door: connected RocketMQ clients per group, and a check sent over a
producer's Telemetry stream shown in the transaction's trace like one sent over HTTP."""

import pytest
from django.test import Client

from apps.broker.models import HalfMessage, Resolver
from apps.broker.services import checkback, checkback_stream, clients, registry
from apps.broker.services.callbacks import CheckResult
from apps.broker.services.transactions import Actor
from tests.support.console import login


@pytest.fixture
def connected(db: None) -> int:
    """The token of the connected clients."""
    registry.consumer_group_create(name="billing", max_delivery_attempts=16, consume_from="first")
    token, _ = registry.token_create(name="rocketmq", scopes=["produce:shop", "consume:billing"])
    for client_id, client_type, group, language, version in (
        ("app-1@101@0@prod", "PRODUCER", "shop", "PYTHON", "5.1.2"),
        ("app-2@202@0@push", "PUSH_CONSUMER", "billing", "NODE_JS", "1.0.8"),
    ):
        clients.client_seen(
            client_id=client_id,
            token_id=token.pk,
            client_type=client_type,
            group=group,
            language=language,
            version=version,
            hostname=client_id.split("@")[0],
        )
    clients.client_stream_opened(
        client_id="app-1@101@0@prod", token_id=token.pk, process="grpc-host:4242"
    )
    return token.pk


def viewer() -> Client:
    return login("txhub-viewers", "vera")


def test_producer_groups_list_their_connected_rocketmq_producers(
    half: HalfMessage, connected: int
) -> None:
    page = viewer().get("/console/producer-groups/").content.decode()
    row = page[page.index("app-1@101@0@prod") :].split("</tr>")[0]
    for shown in ("shop", "PRODUCER", "PYTHON", "5.1.2", "app-1", "open on grpc-host:4242"):
        assert shown in row, shown
    assert "app-2@202@0@push" not in page  # a consumer is listed with its consumer group


def test_a_consumer_group_lists_its_connected_rocketmq_consumers(connected: int) -> None:
    page = viewer().get("/console/consumer-groups/billing/").content.decode()
    row = page[page.index("app-2@202@0@push") :].split("</tr>")[0]
    for shown in ("PUSH_CONSUMER", "NODE_JS", "1.0.8", "app-2", "closed"):
        assert shown in row, shown
    assert "app-1@101@0@prod" not in page


def test_a_check_over_the_stream_shows_in_the_trace_with_client_and_process(
    half: HalfMessage, connected: int
) -> None:
    sent = {
        "via": "telemetry",
        "client_id": "app-1@101@0@prod",
        "token_id": connected,
        "process": "grpc-host:4242",
    }
    # What check-back writes when it hands the check to the process holding the stream...
    checkback.checkback_apply(
        half_id=half.pk, result=CheckResult("UNKNOWN", True, None, "", 0, "", via=sent)
    )
    # ...and when the producer's EndTransaction(SOURCE_SERVER_CHECK) answers it.
    checkback_stream.checkback_answer(
        transaction_id=half.transaction_id,
        answer="COMMIT",
        client_id="app-1@101@0@prod",
        token_id=connected,
        producer=Actor(Resolver.PRODUCER, "rocketmq"),
        producer_groups=None,
    )
    page = viewer().get(f"/console/transactions/{half.transaction_id}/").content.decode()
    trace = page[page.index('id="timeline"') :].split("</table>")[0]
    rows = [row for row in trace.split("<tr>") if "<td>CHECK</td>" in row]
    assert len(rows) == 2
    assert "answer UNKNOWN, over the Telemetry stream of RocketMQ client" in rows[0]
    assert "app-1@101@0@prod" in rows[0]
    assert "gRPC process grpc-host:4242" in rows[0]
    assert "answer COMMIT" in rows[1]
    assert "applied" in rows[1]
    assert "not reached" not in trace  # a stream check is not an unreachable HTTP callback


def test_one_client_id_under_two_tokens_is_listed_as_two_clients_with_their_tokens(
    connected: int,
) -> None:
    # Another tenant's client of the same id is its own client (docs/decisions/0100).
    other, _ = registry.token_create(name="other-tenant", scopes=["consume:billing"])
    clients.client_seen(
        client_id="app-2@202@0@push",
        token_id=other.pk,
        client_type="SIMPLE_CONSUMER",
        group="billing",
        language="JAVA",
    )
    page = viewer().get("/console/consumer-groups/billing/").content.decode()
    rows = [row for row in page.split("<tr>") if "app-2@202@0@push" in row]
    assert len(rows) == 2, rows
    by_token = {("rocketmq" in row, "other-tenant" in row): row for row in rows}
    assert "PUSH_CONSUMER" in by_token[(True, False)]
    assert "SIMPLE_CONSUMER" in by_token[(False, True)]
