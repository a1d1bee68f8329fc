from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.broker import limits
from apps.broker.services import registry


class Command(BaseCommand):
    help = "Creates an API token and prints it alone on stdout (shown once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument(
            "--scope",
            action="append",
            required=True,
            help="admin, produce:<producer group> or consume:<consumer group>; repeatable",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            scopes = [limits.check_scope(scope) for scope in options["scope"]]
        except limits.LimitError as error:
            raise CommandError(str(error)) from None
        _, raw = registry.token_create(name=options["name"], scopes=scopes)
        self.stdout.write(raw)
