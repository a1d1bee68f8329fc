"""`make run`'s superuser: a random password printed once, nothing in clear, the env wins."""

import io
import re

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command


def ensure(monkeypatch: pytest.MonkeyPatch, password: str | None = None) -> str:
    monkeypatch.delenv("TXHUB_ADMIN_USER", raising=False)
    if password is None:
        monkeypatch.delenv("TXHUB_ADMIN_PASSWORD", raising=False)
    else:
        monkeypatch.setenv("TXHUB_ADMIN_PASSWORD", password)
    out = io.StringIO()
    call_command("ensure_superuser", stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_a_new_superuser_gets_a_random_password_printed_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = ensure(monkeypatch)
    match = re.search(r"Console superuser created: admin / (\S+)", first)
    assert match
    password = match.group(1)
    assert password != "txhub-admin"
    assert len(password) >= 20
    admin = User.objects.get(username="admin")
    assert admin.is_superuser
    assert admin.check_password(password)
    assert password not in admin.password  # stored hashed, not in clear

    again = ensure(monkeypatch)
    assert password not in again
    assert admin.password == User.objects.get(username="admin").password


@pytest.mark.django_db
def test_two_installs_get_different_passwords(monkeypatch: pytest.MonkeyPatch) -> None:
    first = re.findall(r"admin / (\S+)", ensure(monkeypatch))
    User.objects.all().delete()
    second = re.findall(r"admin / (\S+)", ensure(monkeypatch))
    assert first
    assert second
    assert first != second


@pytest.mark.django_db
def test_txhub_admin_password_wins_and_is_not_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    created = ensure(monkeypatch, "operator-chosen-1")
    assert "operator-chosen-1" not in created
    assert User.objects.get(username="admin").check_password("operator-chosen-1")
    changed = ensure(monkeypatch, "operator-chosen-2")
    assert "operator-chosen-2" not in changed
    assert User.objects.get(username="admin").check_password("operator-chosen-2")
