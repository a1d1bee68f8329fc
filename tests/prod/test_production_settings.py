"""Production defaults: the secret key, `check --deploy`, the TLS knobs, secrets kept out of
cookies. Settings are read at import, so each configuration runs in a subprocess of its own."""

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client, override_settings

from apps.broker.models import ApiToken, ProducerGroup
from tests.conftest import ROOT
from tests.support.console import login
from tests.support.metrics import METRICS_HEADERS
from tests.support.production import BEHIND_A_TLS_PROXY

# The environment docs/operations.md's "Production" section documents (values are examples).
PRODUCTION_ENV = {
    "TXHUB_DEBUG": "0",
    "TXHUB_SECRET_KEY": secrets.token_urlsafe(50),
    "TXHUB_ALLOWED_HOSTS": "txhub.example.com",
    "TXHUB_CSRF_TRUSTED_ORIGINS": "https://txhub.example.com",
    **BEHIND_A_TLS_PROXY,
    "TXHUB_CALLBACK_ALLOWED_HOSTS": "",
    "TXHUB_ALLOW_HTTP_CALLBACKS": "0",
    "TXHUB_METRICS_TOKEN": secrets.token_urlsafe(32),
    "TXHUB_CREDENTIALS_KEY": secrets.token_urlsafe(50),
    "TXHUB_THROTTLE_RATE": "2000/s",
}

SHOW_KEY = (
    "import django; django.setup(); from django.conf import settings; print(settings.SECRET_KEY)"
)


def run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    inherited = {
        "TXHUB_SECRET_KEY",
        "TXHUB_DEBUG",
        "TXHUB_CREDENTIALS_KEY",
        "TXHUB_FAILPOINTS",
        "TXHUB_METRICS_TOKEN",  # the tests' own (tests/support/metrics.py)
    }
    base = {k: v for k, v in os.environ.items() if k not in inherited}
    base["DJANGO_SETTINGS_MODULE"] = "txhub.settings"
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    "key_env",
    [
        {},
        {"TXHUB_SECRET_KEY": ""},
        {"TXHUB_SECRET_KEY": "txhub-local-development-only-not-a-secret"},
    ],
    ids=["unset", "empty", "public-default"],
)
def test_without_a_real_secret_key_txhub_refuses_to_start(
    key_env: dict[str, str], tmp_path: Path
) -> None:
    missing = str(tmp_path / "no-such-file")
    for args in (["-c", SHOW_KEY], ["manage.py", "check"]):
        result = run(args, TXHUB_DEBUG="0", TXHUB_SECRET_KEY_FILE=missing, **key_env)
        assert result.returncode != 0
        assert "ImproperlyConfigured" in result.stderr
        assert "TXHUB_SECRET_KEY is not set" in result.stderr


def test_the_local_key_file_is_read_and_the_environment_wins(tmp_path: Path) -> None:
    key_file = tmp_path / "secret-key"
    key_file.write_text("from-the-file-" + secrets.token_urlsafe(40) + "\n")
    from_file = run(["-c", SHOW_KEY], TXHUB_DEBUG="0", TXHUB_SECRET_KEY_FILE=str(key_file))
    assert from_file.returncode == 0, from_file.stderr
    assert from_file.stdout.strip() == key_file.read_text().strip()
    from_env = run(
        ["-c", SHOW_KEY],
        TXHUB_DEBUG="0",
        TXHUB_SECRET_KEY="from-the-environment",
        TXHUB_SECRET_KEY_FILE=str(key_file),
    )
    assert from_env.stdout.strip() == "from-the-environment"


def test_the_local_setup_wrote_a_private_key_file_that_this_run_uses() -> None:
    key_file = Path(settings.SECRET_KEY_FILE)
    if os.environ.get("TXHUB_SECRET_KEY"):
        pytest.skip("this run's key comes from the environment")
    assert key_file.is_file()
    assert key_file.stat().st_mode & 0o077 == 0  # 0600: readable by its owner only
    assert key_file.read_text().strip() == settings.SECRET_KEY
    assert len(settings.SECRET_KEY) >= 50


def test_check_deploy_passes_with_the_documented_production_environment() -> None:
    result = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], **PRODUCTION_ENV)
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_deploy_flags_a_key_read_from_the_checkout_file(tmp_path: Path) -> None:
    key_file = tmp_path / "secret-key"
    key_file.write_text(secrets.token_urlsafe(50))
    env = {k: v for k, v in PRODUCTION_ENV.items() if k != "TXHUB_SECRET_KEY"}
    result = run(
        ["manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        TXHUB_SECRET_KEY_FILE=str(key_file),
        **env,
    )
    assert result.returncode != 0
    assert "txhub.W001" in result.stdout + result.stderr


@pytest.mark.django_db
def test_ssl_redirect_spares_the_probes_and_the_scrape_endpoint() -> None:
    with override_settings(SECURE_SSL_REDIRECT=True):
        client = Client()
        for path in ("/healthz", "/readyz", "/metrics"):
            assert client.get(path, headers=METRICS_HEADERS).status_code in {200, 503}, path
        login_page = client.get("/console/login/")
        assert login_page.status_code == 301
        assert login_page["Location"].startswith("https://")
        # Behind the proxy, a request it marks as HTTPS is served.
        with override_settings(SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https")):
            proxied = Client().get("/console/login/", HTTP_X_FORWARDED_PROTO="https")
            assert proxied.status_code == 200


def _set_cookies(response: Any) -> str:
    return " ".join(morsel.OutputString() for morsel in response.cookies.values())


@pytest.mark.django_db
def test_secrets_shown_once_never_travel_in_a_cookie() -> None:
    otto = login("txhub-operators", "otto")
    created = otto.post("/console/tokens/new/", {"name": "deploy", "scopes": "admin"})
    assert created.status_code == 302
    shown = otto.get(created["Location"])
    match = re.search(r"Token deploy: (txh_[A-Za-z0-9_-]+)", shown.content.decode())
    assert match  # still shown once, on the next page
    raw = match.group(1)
    assert ApiToken.objects.filter(name="deploy").exists()
    assert raw not in _set_cookies(created) + _set_cookies(shown)
    assert "messages" not in created.cookies

    group = otto.post(
        "/console/producer-groups/new/", {"name": "shop", "check_url": "http://127.0.0.1:9/c"}
    )
    assert group.status_code == 302
    secret = ProducerGroup.objects.get(name="shop").signing_secret
    page = otto.get(group["Location"])
    assert secret in page.content.decode()
    assert secret not in _set_cookies(group) + _set_cookies(page)


def check_deploy(**env: str) -> tuple[int, str]:
    result = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], **env)
    return result.returncode, result.stdout + result.stderr


def test_check_deploy_errors_when_metrics_are_open_in_production() -> None:
    env = {k: v for k, v in PRODUCTION_ENV.items() if k != "TXHUB_METRICS_TOKEN"}
    code, printed = check_deploy(**env)
    assert code != 0
    assert "txhub.E001" in printed
    assert "txhub.E001" not in check_deploy(**PRODUCTION_ENV)[1]  # the positive control


def test_check_deploy_errors_when_rocketmq_secrets_derive_from_the_secret_key() -> None:
    env = {**PRODUCTION_ENV, "TXHUB_CREDENTIALS_KEY": PRODUCTION_ENV["TXHUB_SECRET_KEY"]}
    code, printed = check_deploy(**env)
    assert code != 0
    assert "txhub.E002" in printed


def test_check_deploy_flags_a_credentials_key_read_from_the_checkout_file(tmp_path: Path) -> None:
    key_file = tmp_path / "credentials-key"
    key_file.write_text(secrets.token_urlsafe(50))
    env = {k: v for k, v in PRODUCTION_ENV.items() if k != "TXHUB_CREDENTIALS_KEY"}
    code, printed = check_deploy(TXHUB_CREDENTIALS_KEY_FILE=str(key_file), **env)
    assert code != 0
    assert "txhub.W002" in printed


def test_a_production_run_without_a_credentials_key_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in PRODUCTION_ENV.items() if k != "TXHUB_CREDENTIALS_KEY"}
    result = run(["manage.py", "check"], TXHUB_CREDENTIALS_KEY_FILE=str(tmp_path / "none"), **env)
    assert result.returncode != 0
    assert "TXHUB_CREDENTIALS_KEY is not set" in result.stderr


@pytest.mark.parametrize(
    ("extra", "starts"),
    [
        ({}, False),
        ({"TXHUB_ALLOW_FAILPOINTS": "1"}, True),
        ({"TXHUB_DEBUG": "1"}, True),
    ],
    ids=["refused", "allowed on purpose", "debug run"],
)
def test_failpoints_are_refused_at_start_outside_a_debug_run(
    extra: dict[str, str], starts: bool
) -> None:
    env = {**PRODUCTION_ENV, "TXHUB_FAILPOINTS": "after_half_insert=exit", **extra}
    result = run(["manage.py", "check"], **env)
    assert (result.returncode == 0) == starts, result.stderr[-2000:]
    if not starts:
        assert "TXHUB_FAILPOINTS is set but TXHUB_DEBUG is off" in result.stderr
