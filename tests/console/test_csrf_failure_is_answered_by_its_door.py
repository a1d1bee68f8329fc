"""A request the CSRF check refuses is answered as its door answers (settings.CSRF_FAILURE_VIEW,
dispatched by errors.door_of; docs/decisions/0114): under /console/ the console's own page, 403,
with its navigation, what went wrong and a way back; the admin's stays Django's page, and the
API's the contract's JSON."""

import json

from django.contrib.auth.models import User
from django.test import Client, RequestFactory
from django.urls import reverse

from apps.broker.api.errors import csrf_failure
from apps.broker.models import Topic
from tests.support.console import login

STALE_FORM = "reload that page and send the form again"


def test_a_console_form_without_its_csrf_token_gets_the_consoles_page(db: None) -> None:
    operator = login("txhub-operators", "otto")
    operator.handler.enforce_csrf_checks = True
    came_from = "http://testserver/console/topics/"
    response = operator.post(
        reverse("console:topic-create"), {"name": "refunds", "queues": "1"}, HTTP_REFERER=came_from
    )
    assert response.status_code == 403
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert "<h1>Not allowed</h1>" in page
    assert STALE_FORM in page
    assert 'href="/console/transactions/"' in page  # the console's navigation
    assert '<a href="/console/topics/">Back</a>' in page  # to the page the form was on
    assert "ask an administrator" not in page  # an operator's form: no role is missing
    assert not Topic.objects.exists()


def test_a_sign_in_without_its_csrf_cookie_gets_the_consoles_page(db: None) -> None:
    User.objects.create_user("otto", password="otto-pass-9527")
    client = Client(enforce_csrf_checks=True)
    form = {"username": "otto", "password": "otto-pass-9527"}
    response = client.post(reverse("console:login"), form)
    assert response.status_code == 403
    page = response.content.decode()
    assert STALE_FORM in page
    assert 'href="/console/login/"' in page


def test_the_admins_csrf_failure_stays_djangos_page(db: None) -> None:
    client = Client(enforce_csrf_checks=True)
    response = client.post("/admin/login/", {"username": "root", "password": "x"})
    assert response.status_code == 403
    assert "CSRF verification failed" in response.content.decode()


def test_the_apis_csrf_failure_is_the_contracts_json() -> None:
    """No API view takes a session (DRF's views are exempt), so no request reaches this case;
    the view answers it as the contract says all the same."""
    response = csrf_failure(RequestFactory().post("/api/v1/topics"), reason="CSRF cookie not set.")
    assert response.status_code == 403
    assert response["Content-Type"] == "application/json"
    body = json.loads(response.content)
    assert set(body) == {"error"}
    assert body["error"]["code"] == "forbidden"
    assert body["error"]["details"] == {}
