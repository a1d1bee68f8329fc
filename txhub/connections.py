"""What settings.py needs to reach a highly available deployment (docs/decisions/0042, 0043):
the env file `make run-ha` writes, libpq's multi-host URLs, Sentinel addresses. Runs while
settings.py is read: nothing here needs Django configured."""

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured


def read_env_file(path: Path) -> None:
    """`NAME='value'` lines into the environment, where not already set (set variables win)."""
    if not path.is_file():
        return
    for line in path.read_text().splitlines():
        name, _, value = line.partition("=")
        if name.strip() and not name.lstrip().startswith("#"):
            os.environ.setdefault(name.strip(), value.strip().strip("'"))


def parse_database_url(url: str, **options: Any) -> dict[str, Any]:
    """dj-database-url's parse, and libpq's multi-host form too
    (postgres://user@h1:p1,h2:p2,h3:p3/db?target_session_attrs=read-write, decision 0042): its
    hosts and ports become comma-separated HOST and PORT, which libpq reads as lists."""
    parts = urlsplit(url)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    if "," not in hostlist:
        return dict(dj_database_url.parse(url, **options))
    hosts, ports = [], []
    for host in hostlist.split(","):
        name, colon, port = host.rpartition(":")
        has_port = bool(colon) and not host.endswith("]")
        hosts.append(name if has_port else host)
        ports.append(port if has_port else "5432")
    first = urlunsplit(parts._replace(netloc=userinfo + at + hosts[0]))
    config = dict(dj_database_url.parse(first, **options))
    config["HOST"], config["PORT"] = ",".join(hosts), ",".join(ports)
    return config


def sentinel_addresses(items: list[str]) -> list[tuple[str, int]]:
    """ "host:port" items as redis-py's Sentinel takes them."""
    found = []
    for item in items:
        host, _, port = item.rpartition(":")
        found.append((host, int(port)))
    return found


def cache_through_sentinels(sentinels: list[str], master: str) -> dict[str, Any]:
    """Options of Django's RedisCache that find its Redis through the Sentinels."""
    return {
        "pool_class": "txhub.redis_sentinel.CachePool",
        "sentinels": sentinel_addresses(sentinels),
        "service_name": master,
    }


def celery_through_sentinels(sentinels: list[str], master: str) -> tuple[str, str, dict[str, str]]:
    """Celery's broker URL, transport and transport options with kombu's Sentinel transport
    (txhub/broker_transport.py's variant of it)."""
    # Celery reads the CELERY_BROKER_URL variable itself, over the settings: a plain Redis URL
    # there would be asked for the master as if it were a Sentinel.
    if os.environ.get("CELERY_BROKER_URL", "sentinel://").split(":")[0] != "sentinel":
        raise ImproperlyConfigured(
            "TXHUB_REDIS_SENTINELS and CELERY_BROKER_URL are both set: unset CELERY_BROKER_URL "
            "(Celery finds the master through the Sentinels)."
        )
    url = ";".join(f"sentinel://{item}/0" for item in sentinels)
    return url, "txhub.broker_transport:SentinelTransport", {"master_name": master}


def reconnect_while_waited_for(pool: Any) -> None:
    """psycopg_pool's `reconnect_failed` hook: the pool gave up reconnecting after
    TXHUB_DB_POOL_RECONNECT_TIMEOUT. With requests still waiting for a connection, start again
    (`check()` grows an empty pool): otherwise they wait out their whole TXHUB_DB_POOL_TIMEOUT
    although the new primary of a failover has been up for seconds (F16 measured 10 s waits
    after a 3 s switchover; decision 0042)."""
    if pool.get_stats().get("requests_waiting"):
        pool.check()
