"""Console and admin logins are throttled (django-axes, docs/decisions/0012): after the failure
limit even the right password is refused for the cool-off, and only for that user."""

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

PASSWORD = "the-right-password-1"

LOGIN_PAGES = ["/console/login/", "/admin/login/"]


def user(name: str) -> User:
    return User.objects.create_superuser(name, password=PASSWORD)


def attempt(client: Client, page: str, name: str, password: str) -> int:
    response = client.post(page, {"username": name, "password": password})
    return int(response.status_code)


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.mark.django_db
@pytest.mark.parametrize("page", LOGIN_PAGES)
def test_after_the_failure_limit_even_the_right_password_is_refused(page: str) -> None:
    user("mallory-target")
    user("bystander")
    attacker = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        attempt(attacker, page, "mallory-target", "guess")
        assert not logged_in(attacker)

    locked = Client()
    assert attempt(locked, page, "mallory-target", PASSWORD) == 429
    assert not logged_in(locked)

    # Another user, from the same address, is not affected.
    other = Client()
    assert attempt(other, page, "bystander", PASSWORD) == 302
    assert logged_in(other)

    # An operator lifts the lock; then the right password works again.
    call_command("axes_reset", verbosity=0)
    again = Client()
    assert attempt(again, page, "mallory-target", PASSWORD) == 302
    assert logged_in(again)


@pytest.mark.django_db
def test_failures_below_the_limit_do_not_lock_and_a_success_starts_over() -> None:
    user("careless")
    client = Client()
    for _ in range(2):
        for _ in range(settings.AXES_FAILURE_LIMIT - 1):
            assert attempt(client, "/console/login/", "careless", "typo") == 200
        assert attempt(client, "/console/login/", "careless", PASSWORD) == 302
        client.logout()
