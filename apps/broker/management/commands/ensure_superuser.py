import os
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Makes sure the console superuser exists (local installs, `make run`). A new one gets a "
        "random password, printed this once; TXHUB_ADMIN_PASSWORD, when set, is used instead."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        username = os.environ.get("TXHUB_ADMIN_USER", "admin")
        chosen = os.environ.get("TXHUB_ADMIN_PASSWORD", "")
        users = get_user_model().objects
        user = users.filter(username=username).first()
        if user is None:
            password = chosen or secrets.token_urlsafe(18)
            # Only the hash is stored (Django's password hasher); the clear text lives in this
            # one line of output and nowhere else.
            users.create_superuser(username=username, email="", password=password)
            if chosen:
                self.stdout.write(
                    f"Console superuser created: {username} (password from TXHUB_ADMIN_PASSWORD)"
                )
            else:
                self.stdout.write(
                    f"Console superuser created: {username} / {password}\n"
                    "  This password is shown only now; change it with "
                    f"`python manage.py changepassword {username}`."
                )
        elif chosen:
            # The operator's choice wins, also over a password set earlier.
            if not user.check_password(chosen):
                user.set_password(chosen)
                user.save(update_fields=["password"])
            self.stdout.write(f"Console superuser: {username} (password from TXHUB_ADMIN_PASSWORD)")
        else:
            self.stdout.write(
                f"Console superuser: {username} (password as printed when it was created; "
                f"reset it with `python manage.py changepassword {username}`)"
            )
