"""/metrics names every tenant's topics and groups (docs/decisions/0090): an anonymous caller gets
a 401 and none of them, whether or not TXHUB_METRICS_TOKEN is set; the scraper holding the token
and an operator signed in to the console read them all."""

from typing import Any

from django.contrib.auth.models import Group, User
from django.test import Client

from apps.broker.services import registry
from apps.console import roles
from tests.support.transactions import make_group, prepare

NAMES = ("acme-payments", "acme-orders")
TOPIC = NAMES[1]  # the group's name shows once beat has measured its stored bytes


def a_tenants_objects() -> None:
    group = make_group(name=NAMES[0])
    prepare(group, registry.topic_create(name=NAMES[1], queues=1))


def names_in(response: Any) -> list[str]:
    body = response.content.decode()
    return [name for name in NAMES if name in body]


def test_an_anonymous_caller_learns_no_tenant_names_without_a_token_set(
    db: None, settings: Any
) -> None:
    settings.TXHUB_METRICS_CACHE_SECONDS = 0
    settings.TXHUB_METRICS_TOKEN = ""
    a_tenants_objects()
    anonymous = Client().get("/metrics")
    assert anonymous.status_code == 401
    assert anonymous["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert names_in(anonymous) == []
    # Any bearer is refused when none is configured: an empty one must not match an empty token.
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


def test_the_token_holder_and_a_signed_in_operator_read_the_tenant_series(
    db: None, settings: Any
) -> None:
    settings.TXHUB_METRICS_CACHE_SECONDS = 0
    settings.TXHUB_METRICS_TOKEN = "s3cret"
    a_tenants_objects()
    scraper = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert scraper.status_code == 200
    assert TOPIC in names_in(scraper)
    operator = Client()
    vera = User.objects.create_user("vera")
    vera.groups.add(Group.objects.get_or_create(name=roles.OPERATORS)[0])
    operator.force_login(vera)
    assert TOPIC in names_in(operator.get("/metrics"))
    settings.TXHUB_METRICS_TOKEN = ""
    assert TOPIC in names_in(operator.get("/metrics"))


def test_a_signed_in_user_the_console_refuses_reads_nothing(db: None, settings: Any) -> None:
    settings.TXHUB_METRICS_TOKEN = ""
    a_tenants_objects()
    # Staff without a console role is no operator (apps/console/roles.py), nor is a plain user.
    for user in (User.objects.create_user("guest"), User.objects.create_user("sam", is_staff=True)):
        someone = Client()
        someone.force_login(user)
        refused = someone.get("/metrics")
        assert refused.status_code == 401
        assert names_in(refused) == []
    viewer = User.objects.create_user("val")
    viewer.groups.add(Group.objects.get_or_create(name=roles.VIEWERS)[0])
    someone = Client()
    someone.force_login(viewer)
    assert TOPIC in names_in(someone.get("/metrics"))  # the positive control: a console viewer
