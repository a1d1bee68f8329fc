import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Makes sure the console superuser exists and prints its login (local installs)."

    def handle(self, *args: Any, **options: Any) -> None:
        username = os.environ.get("TXHUB_ADMIN_USER", "admin")
        password = os.environ.get("TXHUB_ADMIN_PASSWORD", "txhub-admin")
        users = get_user_model().objects
        if not users.filter(username=username).exists():
            users.create_superuser(username=username, email="", password=password)
            self.stdout.write(f"Console superuser created: {username} / {password}")
        else:
            self.stdout.write(
                f"Console superuser: {username} (password as set; default {password!r})"
            )
