import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.broker.services import credentials, registry
from apps.broker.services.audit import origin_of_cli
from apps.broker.services.errors import BrokerError


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
        parser.add_argument(
            "--json",
            action="store_true",
            help="print {id, token, access_key, secret_key} as JSON instead of the token alone",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # The name and scope rules are the service's (docs/decisions/0106); its refusal is the
        # command's error, and nothing is stored.
        try:
            token, raw = registry.token_create(
                name=options["name"], scopes=options["scope"], origin=origin_of_cli()
            )
        except BrokerError as error:
            raise CommandError(error.message) from None
        keys = credentials.of(token)
        if options["json"]:
            self.stdout.write(json.dumps({"id": token.pk, "token": raw, **keys}))
            return
        self.stdout.write(raw)
        # The RocketMQ credentials on stderr: stdout stays the token alone (CONTRACT section 3).
        self.stderr.write(f"access_key={keys['access_key']} secret_key={keys['secret_key']}")
