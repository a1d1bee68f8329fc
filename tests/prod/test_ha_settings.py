"""`make run-ha`'s settings (docs/decisions/0042, 0043): libpq's multi-host URL, the var/ha/env
file, Redis behind Sentinels. Settings are read at import: each case runs in a subprocess."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

CLUSTER_URL = (
    "postgres://txhub@127.0.0.1:54331,127.0.0.1:54332,127.0.0.1:54333/txhub"
    "?target_session_attrs=read-write&connect_timeout=2&keepalives_idle=5"
)
SHOW = """
import json, django
django.setup()
from django.conf import settings
from apps.broker.wakeups import _conninfo
from apps.broker.services.reconciliation import database_url
db = settings.DATABASES["default"]
print(json.dumps({
    "host": db["HOST"], "port": str(db["PORT"]), "name": db["NAME"],
    "options": {k: v for k, v in db["OPTIONS"].items() if k != "pool"},
    "listen": _conninfo(),
    "job": database_url(),
    "broker": settings.CELERY_BROKER_URL, "transport": settings.CELERY_BROKER_TRANSPORT,
    "broker_options": getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}),
    "cache": settings.CACHES["default"]["OPTIONS"],
    "receive_sync": settings.TXHUB_RECEIVE_SYNCHRONOUS_COMMIT,
}))
"""


def settings_with(**env: str) -> dict[str, Any]:
    names = (
        "DATABASE_URL",
        "TXHUB_REDIS_SENTINELS",
        "TXHUB_HA_ENV_FILE",
        "CELERY_BROKER_URL",
        "TXHUB_RECEIVE_SYNCHRONOUS_COMMIT",
    )
    base = {k: v for k, v in os.environ.items() if k not in names}
    done = subprocess.run(
        [sys.executable, "-c", SHOW],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "txhub.settings", "TXHUB_HA_ENV_FILE": "", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_a_multi_host_url_gives_libpq_its_host_and_port_lists() -> None:
    found = settings_with(DATABASE_URL=CLUSTER_URL)
    assert found["host"] == "127.0.0.1,127.0.0.1,127.0.0.1"
    assert found["port"] == "54331,54332,54333"
    assert found["name"] == "txhub"
    assert found["options"]["target_session_attrs"] == "read-write"
    # The LISTEN connection finds the primary too: NOTIFY is sent there.
    assert "target_session_attrs=read-write" in found["listen"]
    assert "port=54331,54332,54333" in found["listen"]
    # A receive waits for a standby too: an old primary must not answer one (decision 0050).
    assert found["receive_sync"] is True
    assert "keepalives_idle=5" in found["listen"]
    assert "connect_timeout=2" in found["listen"]
    # The nightly job gets the same hosts (it reads a standby through JDBC by itself).
    assert found["job"] == (
        "postgresql://txhub@127.0.0.1:54331,127.0.0.1:54332,127.0.0.1:54333/txhub"
        "?target_session_attrs=read-write"
    )


def test_a_single_host_url_is_read_as_before() -> None:
    found = settings_with(DATABASE_URL="postgres://txhub@127.0.0.1:54329/txhub")
    assert (found["host"], found["port"]) == ("127.0.0.1", "54329")
    assert "target_session_attrs" not in found["options"]
    assert "target_session_attrs" not in found["listen"]
    assert found["job"] == "postgresql://txhub@127.0.0.1:54329/txhub"
    assert found["transport"] == "txhub.broker_transport:Transport"
    assert "pool_class" not in found["cache"]
    assert found["receive_sync"] is False  # one Postgres: decision 0025


def test_the_ha_env_file_is_read_and_the_environment_wins(tmp_path: Path) -> None:
    env_file = tmp_path / "env"
    env_file.write_text(f"DATABASE_URL='{CLUSTER_URL}'\nTXHUB_REDIS_SENTINEL_MASTER='other'\n")
    assert settings_with(TXHUB_HA_ENV_FILE=str(env_file))["port"] == "54331,54332,54333"
    chosen = settings_with(
        TXHUB_HA_ENV_FILE=str(env_file), DATABASE_URL="postgres://txhub@127.0.0.1:5999/txhub"
    )
    assert chosen["port"] == "5999"
    assert settings_with(TXHUB_HA_ENV_FILE="")["port"] != "54331,54332,54333"


def test_sentinels_carry_celery_and_the_cache() -> None:
    found = settings_with(TXHUB_REDIS_SENTINELS="127.0.0.1:26381,127.0.0.1:26382")
    assert found["broker"] == "sentinel://127.0.0.1:26381/0;sentinel://127.0.0.1:26382/0"
    assert found["transport"] == "txhub.broker_transport:SentinelTransport"
    assert found["broker_options"] == {"master_name": "txhub"}
    assert found["cache"]["pool_class"] == "txhub.redis_sentinel.CachePool"
    assert found["cache"]["sentinels"] == [["127.0.0.1", 26381], ["127.0.0.1", 26382]]


def test_sentinels_with_a_plain_broker_url_refuse_to_start() -> None:
    # Celery would read the variable over the settings and ask a plain Redis for the master.
    with pytest.raises(subprocess.CalledProcessError) as refused:
        settings_with(TXHUB_REDIS_SENTINELS="127.0.0.1:26381", CELERY_BROKER_URL="redis://x:1/0")
    assert "unset CELERY_BROKER_URL" in refused.value.stderr


def test_receives_may_be_told_to_wait_for_their_flush_on_one_host_too() -> None:
    found = settings_with(
        DATABASE_URL="postgres://txhub@127.0.0.1:54329/txhub", TXHUB_RECEIVE_SYNCHRONOUS_COMMIT="1"
    )
    assert found["receive_sync"] is True
