"""The operator console as a signed-in user."""

from django.contrib.auth.models import Group, User
from django.test import Client


def login(role: str | None, name: str) -> Client:
    """A client signed in as a new user `name` in the group `role` (None: no group;
    "superuser": a superuser)."""
    user = User.objects.create_user(name)
    if role == "superuser":
        user.is_superuser = True
        user.save()
    elif role:
        # The roles' migration made them; a transactional test's flush (run before this one in
        # the same worker) may have removed them since.
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    client = Client()
    client.force_login(user)
    return client
