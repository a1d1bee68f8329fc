"""The Django admin honours Django's model permissions: being staff shows nothing by itself."""

from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db.models import Model
from django.test import Client
from django.urls import reverse

REGISTERED = sorted(admin.site._registry, key=lambda model: model._meta.label)


def staff(name: str) -> tuple[User, Client]:
    user = User.objects.create_user(name, is_staff=True)
    client = Client()
    client.force_login(user)
    return user, client


def changelist(model: type[Model]) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")


def test_every_txhub_model_is_registered() -> None:
    labels = {model._meta.label for model in REGISTERED}
    assert {"broker.HalfMessage", "broker.OpRecord", "broker.ApiToken"} <= labels


@pytest.mark.parametrize("model", REGISTERED, ids=lambda model: model._meta.label)
def test_a_staff_user_without_permissions_gets_403_on_each_changelist(
    db: None, model: type[Model]
) -> None:
    _, client = staff("stan")
    assert client.get(changelist(model)).status_code == 403


@pytest.mark.parametrize("model", REGISTERED, ids=lambda model: model._meta.label)
def test_the_view_permission_shows_a_changelist_and_only_that_one(
    db: None, model: type[Model]
) -> None:
    user, client = staff("vic")
    codename = f"view_{model._meta.model_name}"
    content_type = ContentType.objects.get_for_model(model)
    user.user_permissions.add(Permission.objects.get(content_type=content_type, codename=codename))
    assert client.get(changelist(model)).status_code == 200
    others = [m for m in REGISTERED if m is not model]
    assert all(client.get(changelist(other)).status_code == 403 for other in others)


def test_the_admin_index_lists_nothing_for_a_staff_user_without_permissions(db: None) -> None:
    _, client = staff("stan")
    page: Any = client.get(reverse("admin:index"))
    assert page.status_code == 200
    assert page.context["app_list"] == []
