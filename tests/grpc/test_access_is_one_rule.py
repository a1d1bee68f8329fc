"""Who may do what is one rule at every door (docs/decisions/0046): the same token, revoked, or
without the scope for a group, or naming a topic its group is not bound to (docs/decisions/0010),
is refused alike by Django's REST door (TXHUB_LEAN_DOOR=0), the lean door (which is seen to have
answered) and the gRPC door, over real gunicorn and grpcserver processes on the test database.
A refusal for a scope or a binding carries the same sentence at every door; "ok" is a 2xx at
REST and OK (or MESSAGE_NOT_FOUND: allowed, nothing there) at gRPC.

The revocation case revokes a token every door has just used, so each door's process has it
cached (config_cache.py, docs/decisions/0026): the refusal after it shows the revocation reaches
every door's cached lookup."""

import signal
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import requests
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import ApiToken
from apps.broker.services import registry
from tests.conftest import start_gunicorn
from tests.grpc.conftest import GrpcServer
from tests.support import workers
from tests.support.grpc import signed
from tests.support.metrics import METRICS_HEADERS
from tests.support.ports import free_port

pytestmark = pytest.mark.e2e

# (verdict, the refusal's sentence when the verdict is "forbidden")
Outcome = tuple[str, str]
# What a call does: ("produce" | "consume", group, topic). A gRPC producer names no group: its
# token's one produce scope is its group, so produce calls use tokens with one such scope.
Action = tuple[str, str, str]


@dataclass(frozen=True)
class Web:
    base: str

    def post(self, path: str, body: dict[str, Any], raw: str) -> requests.Response:
        return requests.post(
            self.base + "/api/v1" + path,
            json=body,
            headers={"Authorization": f"Bearer {raw}"},
            timeout=30,
        )

    def lean_answers(self) -> float:
        text = requests.get(self.base + "/metrics", headers=METRICS_HEADERS, timeout=30).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("txhub_lean_door_answers_total")
        )


def _web(lean: bool) -> Iterator[Web]:
    port = free_port()
    name = "lean" if lean else "django"
    with open(workers.log_path(f"test-gunicorn-access-{name}.log"), "w") as log:
        # One worker: /metrics reads the process that answered.
        process = start_gunicorn(
            port, workers=1, threads=2, log=log, extra_env={"TXHUB_LEAN_DOOR": str(int(lean))}
        )
        yield Web(f"http://127.0.0.1:{port}")
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def lean_web(django_db_setup: None) -> Iterator[Web]:
    yield from _web(True)


@pytest.fixture(scope="module")
def django_web(django_db_setup: None) -> Iterator[Web]:
    yield from _web(False)


def rest(web: Web, action: Action, raw: str) -> Outcome:
    kind, group, topic = action
    if kind == "produce":
        answer = web.post(f"/topics/{topic}/messages", {"producer_group": group, "body": "x"}, raw)
    else:
        answer = web.post(f"/consumer-groups/{group}/receive", {"topic": topic}, raw)
    if answer.status_code in (200, 201):
        return "ok", ""
    error = answer.json()["error"]
    return error["code"], error["message"] if error["code"] == "forbidden" else ""


GRPC_VERDICTS = {
    pb.OK: "ok",
    pb.MESSAGE_NOT_FOUND: "ok",
    pb.UNAUTHORIZED: "unauthenticated",
    pb.FORBIDDEN: "forbidden",
}


def over_grpc(server: GrpcServer, action: Action, token: ApiToken) -> Outcome:
    kind, group, topic = action
    meta = signed(server, token)
    with grpc.insecure_channel(server.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        if kind == "produce":
            message = pb.Message(
                topic=pb.Resource(name=topic),
                body=b"x",
                system_properties=pb.SystemProperties(
                    message_id=uuid.uuid4().hex.upper(), message_type=pb.NORMAL
                ),
            )
            answer = stub.SendMessage(rpc.SendMessageRequest(messages=[message]), metadata=meta)
            got = answer.status
        else:
            receive = rpc.ReceiveMessageRequest(
                group=pb.Resource(name=group),
                message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
            )
            got = next(iter(stub.ReceiveMessage(receive, metadata=meta))).status
    verdict = GRPC_VERDICTS.get(got.code, f"code {got.code}: {got.message}")
    return verdict, got.message if verdict == "forbidden" else ""


@pytest.fixture
def doors(
    django_web: Web, lean_web: Web, grpc_server: GrpcServer
) -> Callable[[Action, ApiToken, str], dict[str, Outcome]]:
    """Each door's outcome of one call with the token (its raw secret for REST, its signed
    access key for gRPC)."""

    def call(action: Action, token: ApiToken, raw: str) -> dict[str, Outcome]:
        before = lean_web.lean_answers()
        outcomes = {"lean": rest(lean_web, action, raw)}
        assert lean_web.lean_answers() == before + 1, "the lean door did not answer the call"
        outcomes["django"] = rest(django_web, action, raw)
        outcomes["grpc"] = over_grpc(grpc_server, action, token)
        return outcomes

    return call


@pytest.fixture
def world(transactional_db: None) -> None:
    for topic in ("acc-open", "acc-closed"):
        registry.topic_create(name=topic, queues=1)
    registry.producer_group_create(name="acc-p")
    registry.producer_group_bind_topics(name="acc-p", topics=["acc-open"])
    for group in ("acc-c", "acc-stranger"):
        registry.consumer_group_create(name=group, max_delivery_attempts=16, consume_from="first")
    registry.consumer_group_bind_topics(name="acc-c", topics=["acc-open"])


def alike(outcomes: dict[str, Outcome], expected: Outcome) -> None:
    assert outcomes == {door: expected for door in ("lean", "django", "grpc")}, outcomes


@pytest.mark.parametrize(
    ("scopes", "action", "expected"),
    [
        # Positive controls: a bound topic with the group's scope; admin may consume as any.
        (["produce:acc-p"], ("produce", "acc-p", "acc-open"), ("ok", "")),
        (["consume:acc-c"], ("consume", "acc-c", "acc-open"), ("ok", "")),
        (["admin"], ("consume", "acc-c", "acc-open"), ("ok", "")),
        # A missing scope.
        (
            ["consume:acc-stranger"],
            ("consume", "acc-c", "acc-open"),
            ("forbidden", "This token has no 'consume:acc-c' scope."),
        ),
        # A topic the group is not bound to.
        (
            ["consume:acc-c"],
            ("consume", "acc-c", "acc-closed"),
            ("forbidden", "Consumer group 'acc-c' is not bound to topic 'acc-closed'."),
        ),
        (
            ["produce:acc-p"],
            ("produce", "acc-p", "acc-closed"),
            ("forbidden", "Producer group 'acc-p' is not bound to topic 'acc-closed'."),
        ),
    ],
)
def test_a_scope_or_binding_is_decided_alike_at_every_door(
    world: None,
    doors: Callable[[Action, ApiToken, str], dict[str, Outcome]],
    scopes: list[str],
    action: Action,
    expected: Outcome,
) -> None:
    token, raw = registry.token_create(name="acc", scopes=scopes)
    alike(doors(action, token, raw), expected)


@pytest.mark.parametrize(
    "action", [("produce", "acc-p", "acc-open"), ("consume", "acc-c", "acc-open")]
)
def test_a_revoked_token_is_refused_alike_at_every_door(
    world: None, doors: Callable[[Action, ApiToken, str], dict[str, Outcome]], action: Action
) -> None:
    token, raw = registry.token_create(name="acc-doomed", scopes=[f"{action[0]}:{action[1]}"])
    alike(doors(action, token, raw), ("ok", ""))  # each door now keeps the token
    registry.token_revoke(token_id=token.pk)
    alike(doors(action, token, raw), ("unauthenticated", ""))
