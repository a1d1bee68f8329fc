"""The operator console as a signed-in user."""

from django.contrib.auth.models import Group, User
from django.test import Client


def login(role: str | None, name: str) -> Client:
    """A client signed in as a new user `name` in the group `role` (None: no group;
    "superuser": a superuser)."""
    user = User.objects.create_user(name, password="pw-12345678")
    if role == "superuser":
        user.is_superuser = True
        user.save()
    elif role:
        user.groups.add(Group.objects.get(name=role))
    client = Client()
    client.force_login(user)
    return client
