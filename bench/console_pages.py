"""Console page times with 100,000 transactions in the database (issue 4: under 200 ms each).

Needs a running txhub (`make run`). Seeds 100,000 transactions born over the last two hours with
set-based SQL (bench/seed.py) into their own producer group and topic, logs in as a viewer over
real HTTP and times the overview, the list (plain, filtered, searched, sorted, a far page) and a
detail page; then removes what it seeded.

    .venv/bin/python bench/console_pages.py [--transactions 100000] [--rounds 20] [--url ...]
"""

import argparse
import os
import re
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")

import django  # noqa: E402

django.setup()

from django.contrib.auth.models import Group, User  # noqa: E402
from django.utils import timezone  # noqa: E402
from seed import seed, unseed  # noqa: E402

from apps.broker.models import HalfMessage  # noqa: E402
from apps.broker.services import registry  # noqa: E402


def login(url: str, username: str, password: str) -> requests.Session:
    session = requests.Session()
    form = session.get(f"{url}/console/login/", timeout=10)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
    assert token, "no CSRF token on the login page"
    session.post(
        f"{url}/console/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": token.group(1)},
        headers={"Referer": f"{url}/console/login/"},
        timeout=10,
    ).raise_for_status()
    return session


def time_page(session: requests.Session, url: str, rounds: int) -> tuple[float, float]:
    session.get(url, timeout=30).raise_for_status()  # warm
    timings = []
    for _ in range(rounds):
        started = time.perf_counter()
        response = session.get(url, timeout=30)
        timings.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
        assert "Log in" not in response.text[:2000] or "/login/" not in response.url
    timings.sort()
    return statistics.median(timings), timings[max(int(len(timings) * 0.99) - 1, 0)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transactions", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--url", default=os.environ.get("TXHUB_URL", "http://127.0.0.1:8000"))
    args = parser.parse_args()

    tag = uuid.uuid4().hex[:8]
    topic = registry.topic_create(name=f"bench-console-{tag}", queues=1)
    group = registry.producer_group_create(
        name=f"bench-console-{tag}", check_url="https://127.0.0.1:9/"
    )
    password = uuid.uuid4().hex
    user = User.objects.create_user(f"bench-{tag}", password=password)
    user.groups.add(Group.objects.get_or_create(name="txhub-viewers")[0])
    try:
        started = time.perf_counter()
        seeded = seed(
            count=args.transactions,
            group=group,
            topic=topic,
            tag=tag,
            start=timezone.now() - timedelta(hours=2),
            spacing_ms=2 * 3600 * 1000 / args.transactions,
        )
        print(f"seeded {seeded} in {time.perf_counter() - started:.1f} s")
        total = HalfMessage.objects.count()
        pending = HalfMessage.objects.filter(producer_group=group, state="PREPARED").first()
        assert pending is not None
        session = login(args.url, user.username, password)
        pages = {
            "overview": "/console/",
            "list": "/console/transactions/",
            "list, pending of one group": (
                f"/console/transactions/?state=PREPARED&producer_group={group.name}"
            ),
            "list, newest first": "/console/transactions/?order=-born_at",
            "list, most checked": "/console/transactions/?order=-check_times",
            "list, search by key": f"/console/transactions/?query={pending.keys[0]}",
            "list, page 1000": "/console/transactions/?page=1000",
            "detail": f"/console/transactions/{pending.transaction_id}/",
        }
        print(f"{total:,} transactions in the database; {args.rounds} requests per page")
        print(f"{'page':32} {'p50 ms':>8} {'p99 ms':>8}")
        for name, path in pages.items():
            p50, p99 = time_page(session, args.url + path, args.rounds)
            print(f"{name:32} {p50:8.1f} {p99:8.1f}")
    finally:
        unseed(group=group, topic=topic)
        user.delete()


if __name__ == "__main__":
    main()
