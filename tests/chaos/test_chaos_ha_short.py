"""F14 in `make test`, shortened: on a highly available cluster of its own (scripts/ha.sh on free
ports: Patroni, etcd, Redis Sentinels; two beats), the primary's machine dies under load. Nothing
acknowledged is lost, and the old primary rejoins by itself (docs/decisions/0042). `make chaos`
runs F14-F19 at full length (tests/chaos/run.py)."""

from pathlib import Path

import pytest

from tests.chaos.ha import HACluster
from tests.chaos.run import CASES, SETTINGS, run_case

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.destructive]


@pytest.mark.timeout(400)
def test_losing_the_primary_loses_nothing_acknowledged(tmp_path: Path) -> None:
    cluster = HACluster(settings=SETTINGS)
    try:
        cluster.start()
        token = cluster.manage("create_token", "chaos", "--scope", "admin").split()[0]
        report = run_case(cluster, token, CASES["F14"], scale=0.3, out=tmp_path, seed=3)
    finally:
        cluster.stop()
        cluster.cleanup()
    print(report.line())
    print(report.details())
    assert report.ok, report.details()
    assert report.ops > 100
    assert any("rejoin" in note or "streaming again" in note for note in report.notes)
