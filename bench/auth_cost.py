"""What authenticating one call costs each door, in process (no server, no HTTP): the REST and
lean doors' `BearerTokenAuthentication.authenticate` (on the lean door's request) and the gRPC
door's signed-caller check with its rate-limit count (`grpc.resources.counted_caller`), against
the Postgres and Redis of the current settings (`make run`'s or your TXHUB_PG_PORT's and
TXHUB_CACHE_URL's). Both read the token through the access module (docs/decisions/0046).

Prints, per door, the CPU and wall time per call: the best of three rounds of `--calls` calls,
after a warm-up (the token is then in the process's cache, as on a busy server). Raise
TXHUB_THROTTLE_RATE above the call rate (e.g. 1000000/s): over it, the gRPC check refuses.

    TXHUB_THROTTLE_RATE=1000000/s .venv/bin/python bench/auth_cost.py [--calls 2000]
"""

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")

import django  # noqa: E402

django.setup()

from django.utils.datastructures import CaseInsensitiveMapping  # noqa: E402

from apps.broker.api.auth import BearerTokenAuthentication  # noqa: E402
from apps.broker.api.lean import LeanRequest  # noqa: E402
from apps.broker.grpc.resources import counted_caller  # noqa: E402
from apps.broker.services import credentials, registry  # noqa: E402


def doors() -> dict[str, Callable[[], object]]:
    name = f"auth-cost-{uuid.uuid4().hex[:6]}"
    token, raw = registry.token_create(name=name, scopes=[f"produce:{name}"])
    keys = credentials.of(token)
    authentication = BearerTokenAuthentication()
    header = f"Bearer {raw}"

    def rest() -> object:
        request = LeanRequest(
            method="POST",
            path="/api/v1/transactions",
            META={"HTTP_AUTHORIZATION": header, "REMOTE_ADDR": "127.0.0.1"},
            headers=CaseInsensitiveMapping({"authorization": header}),
            data={},
        )
        found = authentication.authenticate(request)  # type: ignore[arg-type]
        assert found is not None
        return found

    def grpc() -> object:
        date_time = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        signature = credentials.signature_of(secret_key=keys["secret_key"], date_time=date_time)
        return counted_caller(
            {
                "authorization": f"MQv2-HMAC-SHA1 Credential={keys['access_key']}, "
                f"SignedHeaders=x-mq-date-time, Signature={signature}",
                "x-mq-date-time": date_time,
            }
        )

    return {"REST / lean door": rest, "gRPC door": grpc}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per round (3 rounds)")
    args = parser.parse_args()
    for label, call in doors().items():
        for _ in range(min(200, args.calls)):
            call()
        rounds = []
        for _ in range(3):
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(args.calls):
                call()
            rounds.append(
                (
                    (time.process_time() - cpu) / args.calls * 1e6,
                    (time.perf_counter() - wall) / args.calls * 1e6,
                )
            )
        best_cpu, best_wall = min(rounds)
        print(f"{label}: {best_cpu:.0f} us CPU, {best_wall:.0f} us wall per authentication")


if __name__ == "__main__":
    main()
