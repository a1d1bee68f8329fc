"""Schemathesis's own command line with every check (`--checks all`) against a real gunicorn
(issue 26): besides no 5xx and answers as documented (tests/test_fuzz_api.py), the API must take
every request its schema allows (positive_data_acceptance) and refuse every request it does not
(negative_data_rejection). So the schema states each limit the API enforces
(apps/broker/limits.py; docs/decisions/0045); tests/schemathesis_hooks.py sets aside only the
rules no schema can state.

Bounded for the suite's budget: a fixed seed, few examples per operation, one worker; run in a
directory of its own, so no cache of an earlier run (.schemathesis/) changes what it sends."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, Server
from tests.test_fuzz_api import _prepare

pytestmark = pytest.mark.e2e

SEED = 20261125
EXAMPLES = 5


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
        str(SEED),
        "--max-examples",
        str(EXAMPLES),
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
    assert "Selected: 35/35" in text or "Tested: " in text, text[-5000:]
