"""Property-based fuzzing of the whole API (issue 9): Schemathesis reads /api/schema/ from a real
gunicorn and sends, for every operation, valid and invalid requests generated from the schema,
once with an admin token and once with a produce/consume token. No answer may be a 5xx, and
every answer must be what the schema documents (status code, content type, body shape).

And Schemathesis's own command line with every check (`--checks all`, issue 26): the API must
also take every request its schema allows (positive_data_acceptance) and refuse every request it
does not (negative_data_rejection). So the schema states each limit the API enforces
(apps/broker/limits.py; docs/decisions/0045); tests/schemathesis_hooks.py sets aside only the
rules no schema can state. It runs in a directory of its own, so no cache of an earlier run
(.schemathesis/) changes what it sends.

Bounded for the suite's budget: a fixed seed, a fixed number of examples per operation, no
shrinking (a failure is reported with the request that caused it)."""

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, assume, given, seed, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.conftest import ROOT, Server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLES = 20
CLI_SEED = 20261125
CLI_EXAMPLES = 5
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def _prepare(server: Server) -> dict[str, str]:
    admin = server.token("admin")
    for path, payload in (
        ("/api/v1/topics", {"name": "orders", "queues": 2}),
        ("/api/v1/producer-groups", {"name": "order-service", "check_url": "http://127.0.0.1:9/"}),
        ("/api/v1/consumer-groups", {"name": "billing"}),
    ):
        answer = requests.post(server.url(path), json=payload, headers=admin, timeout=10)
        assert answer.status_code == 201, answer.text
    # Something to find: a sent message and a prepared transaction.
    message = {"producer_group": "order-service", "body": "x", "keys": ["k"]}
    answer = requests.post(
        server.url("/api/v1/topics/orders/messages"), json=message, headers=admin, timeout=10
    )
    assert answer.status_code == 201, answer.text
    answer = requests.post(
        server.url("/api/v1/transactions"),
        json={**message, "topic": "orders"},
        headers=admin,
        timeout=10,
    )
    assert answer.status_code == 201, answer.text
    return admin


def _last(operation: Any) -> tuple[bool, str]:
    # Revoking a token (maybe the fuzzer's own) comes last, so it cannot blind the rest.
    return (operation.method.upper() == "DELETE", operation.path)


def fuzz(server: Server, headers: dict[str, str]) -> None:
    schema = schemathesis.openapi.from_url(server.url("/api/schema/"))
    operations = sorted((result.ok() for result in schema.get_all_operations()), key=_last)  # type: ignore[union-attr]
    assert len(operations) >= 25
    session = requests.Session()
    failures = []
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            checks = CHECKS + ([negative_data_rejection] if mode is GenerationMode.NEGATIVE else [])
            try:
                run_operation(operation, mode, checks, server, headers, session)
            except Exception as error:  # every operation's failure, not only the first  # noqa: BLE001
                failures.append(f"{operation.method.upper()} {operation.path} ({mode}): {error}")
    assert not failures, "\n\n".join(failures)


def run_operation(
    operation: Any,
    mode: GenerationMode,
    checks: list[Callable[..., Any]],
    server: Server,
    headers: dict[str, str],
    session: requests.Session,
) -> None:
    @seed(20261122)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        # gunicorn itself answers 414 (HTML) for a request line over 4094 bytes, before the app.
        assume(len(case.formatted_path) + len(urlencode(case.query or {}, doseq=True)) < 3500)
        if isinstance(case.body, dict) and "wait_seconds" in case.body:
            # Long polling is tested elsewhere; here it would only spend the time budget.
            case.body["wait_seconds"] = 0
        case.call_and_validate(
            base_url=server.base, session=session, headers=headers, checks=checks, timeout=30
        )

    check()


def test_the_api_survives_fuzzing_with_an_admin_token(server: Server) -> None:
    fuzz(server, _prepare(server))


def test_the_api_survives_fuzzing_with_a_produce_consume_token(server: Server) -> None:
    _prepare(server)
    fuzz(server, server.token("produce:order-service", "consume:billing"))


@pytest.mark.slow
def test_the_api_takes_what_its_schema_allows_and_refuses_the_rest(
    server: Server, tmp_path: Path
) -> None:
    headers = _prepare(server)
    report = tmp_path / "schemathesis.txt"
    command = [
        str(Path(sys.executable).parent / "schemathesis"),
        "run",
        server.url("/api/schema/"),
        "--checks",
        "all",
        "--seed",
        str(CLI_SEED),
        "--max-examples",
        str(CLI_EXAMPLES),
        "--workers",
        "1",
        "--no-color",
        "--header",
        f"Authorization: {headers['Authorization']}",
    ]
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks",
        "PYTHONPATH": str(ROOT),
    }
    with report.open("w") as out:
        finished = subprocess.run(  # noqa: S603 - our own command line
            command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=600
        )
    text = report.read_text()
    assert finished.returncode == 0, text[-20000:]
    tested = re.search(r"Tested: (\d+)", text)
    assert tested is not None, text[-5000:]
    assert int(tested.group(1)) >= 25
