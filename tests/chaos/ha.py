"""A highly available txhub of its own for the chaos cases F14-F19 (docs/decisions/0042): the
cluster `make run-ha` runs (scripts/ha.sh: etcd, three Patroni nodes, Redis with a replica and
three Sentinels) on free ports in a temporary directory, and the same web and Celery processes as
tests/chaos/cluster.py, with two beats. Handles to kill, pause and restart a node."""

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import requests

from tests.chaos.cluster import ROOT, Cluster, wait_for
from tests.support.ports import free_ports

NODES = (1, 2, 3)


def make_groups(api: str, headers: dict[str, str], name: str) -> None:
    """A topic (two queues), a producer group with no check URL and a consumer group reading
    from the first offset, all named `name`, through the REST API at `api`."""
    created: list[tuple[str, dict[str, Any]]] = [
        ("/topics", {"name": name, "queues": 2}),
        ("/producer-groups", {"name": name}),
        ("/consumer-groups", {"name": name, "consume_from": "first"}),
    ]
    for path, payload in created:
        answer = requests.post(api + path, json=payload, headers=headers, timeout=30)
        assert answer.status_code == 201, answer.text


class HACluster(Cluster):
    def __init__(self, *, settings: dict[str, str], web_workers: int = 2) -> None:
        super().__init__(settings=settings, web_workers=web_workers, beats=2)
        self.ha_dir = self.dir / "ha"
        ports = free_ports(12, taken={self.pg_port, self.redis_port, self.web_port})
        self.pg_ports, self.rest_ports = ports[0:3], ports[3:6]
        self.redis_ports = [self.redis_port, ports[6]]
        self.sentinel_ports, etcd_ports = ports[7:10], ports[10:12]
        self.ha_env = {
            **os.environ,
            "TXHUB_HA_DIR": str(self.ha_dir),
            "TXHUB_HA_PG_PORTS": " ".join(map(str, self.pg_ports)),
            "TXHUB_HA_REST_PORTS": " ".join(map(str, self.rest_ports)),
            "TXHUB_HA_ETCD_PORTS": " ".join(map(str, etcd_ports)),
            "TXHUB_HA_REDIS_PORTS": " ".join(map(str, self.redis_ports)),
            "TXHUB_HA_SENTINEL_PORTS": " ".join(map(str, self.sentinel_ports)),
            "TXHUB_HA_LOG_LEVEL": "INFO",  # a rejoin's pg_rewind shows in the node's log
        }

    # The services: scripts/ha.sh, as `make run-ha` starts them -----------------------------

    def ha(self, *args: str) -> str:
        done = subprocess.run(
            [str(ROOT / "scripts" / "ha.sh"), *args],
            env=self.ha_env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"scripts/ha.sh {' '.join(args)}: {done.stderr[-2000:]}")
        return done.stdout

    def pg_init(self) -> None:
        self.ha("up")  # the cluster, the database, migrations, and the env file read here
        for line in (self.ha_dir / "env").read_text().splitlines():
            name, _, value = line.partition("=")
            self.env[name] = value.strip("'")
        self.env["TXHUB_HA_ENV_FILE"] = ""  # the environment above says it all
        del self.env["CELERY_BROKER_URL"]  # Celery would read it over the Sentinels (settings)
        self.database_url = self.env["DATABASE_URL"]

    def redis_start(self) -> None:
        """Started with the cluster by scripts/ha.sh (a master, a replica, three Sentinels)."""

    def pg_stop(self, mode: str = "fast") -> None:
        self.ha("down")

    # Nodes ----------------------------------------------------------------------------------

    def rest(self, node: int, path: str) -> requests.Response:
        return requests.get(f"http://127.0.0.1:{self.rest_ports[node - 1]}{path}", timeout=2)

    def primary(self) -> int | None:
        """The node whose Patroni says it is the primary (answers 200 on /primary)."""
        for node in NODES:
            try:
                if self.rest(node, "/primary").status_code == 200:
                    return node
            except requests.RequestException:
                continue
        return None

    def wait_primary(self, *, other_than: int, timeout: float) -> int:
        found: list[int] = []

        def promoted() -> bool:
            node = self.primary()
            if node is not None and node != other_than:
                found.append(node)
            return bool(found)

        wait_for(promoted, timeout, f"a primary other than node{other_than}")
        return found[0]

    def pids(self, node: int) -> tuple[int, int | None]:
        """(Patroni's pid, its Postgres postmaster's pid or None when Postgres is down)."""
        node_dir = self.ha_dir / f"node{node}"
        patroni = int((node_dir / "patroni.pid").read_text())
        postmaster_file = node_dir / "data" / "postmaster.pid"
        try:
            postmaster = int(postmaster_file.read_text().split()[0])
        except (FileNotFoundError, IndexError, ValueError):
            postmaster = None
        return patroni, postmaster

    def signal_node(self, node: int, sig: int) -> None:
        """`sig` to every process of the node, as if to its machine: Patroni, the postmaster and
        the postmaster's children (SIGKILL: the machine died; SIGSTOP: it hangs)."""
        patroni, postmaster = self.pids(node)
        pids = [patroni]
        if postmaster is not None:
            pids.append(postmaster)
            with contextlib.suppress(FileNotFoundError):
                children = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text()
                pids.extend(int(pid) for pid in children.split())
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def node_sql(self, node: int, query: str) -> list[tuple[Any, ...]]:
        """`query` on one node, whatever its role."""
        url = f"postgres://txhub@127.0.0.1:{self.pg_ports[node - 1]}/txhub?connect_timeout=2"
        with psycopg.connect(url, autocommit=True) as conn:
            return list(conn.execute(query).fetchall())

    def post(self, node: int, path: str, payload: dict[str, Any]) -> requests.Response:
        url = f"http://127.0.0.1:{self.rest_ports[node - 1]}{path}"
        return requests.post(url, json=payload, timeout=30)

    def stop_etcd(self) -> None:
        os.kill(int((self.ha_dir / "etcd" / "pid").read_text()), signal.SIGKILL)

    def redis_master(self) -> int:
        """The Redis port the Sentinels name as master."""
        done = subprocess.run(
            ["redis-cli", "-p", str(self.sentinel_ports[0]), "sentinel"]
            + ["get-master-addr-by-name", "txhub"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return int(done.stdout.split()[1])

    def kill_redis(self, port: int) -> None:
        os.kill(int((self.ha_dir / f"redis-{port}" / "redis.pid").read_text()), signal.SIGKILL)

    def wait_redis_master(self, *, other_than: int, timeout: float) -> int:
        wait_for(lambda: self.redis_master() != other_than, timeout, "a new Redis master")
        return self.redis_master()

    def start_node(self, node: int) -> None:
        """Patroni started again, as systemd would after the machine came back."""
        self.ha("start-node", str(node))

    def state(self, node: int) -> dict[str, Any]:
        status: dict[str, Any] = self.rest(node, "/patroni").json()
        return status

    def wait_rejoined(self, node: int, *, timeout: float) -> dict[str, Any]:
        """Until `node` streams from the primary on the primary's timeline (pg_rewind ran)."""
        seen: dict[str, Any] = {}

        def rejoined() -> bool:
            primary = self.primary()
            if primary is None:
                return False
            mine, theirs = self.state(node), self.state(primary)
            seen.update(mine)
            return (
                mine.get("role") == "replica"
                and mine.get("replication_state") == "streaming"
                and mine.get("timeline") == theirs.get("timeline")
            )

        wait_for(rejoined, timeout, f"node{node} streaming again")
        return seen

    def logs_of(self, node: int) -> Path:
        return self.ha_dir / f"node{node}" / "patroni.log"

    def wait_healthy(self, timeout: float = 60) -> None:
        """Three members streaming, one of them synchronous: a case starts from a whole cluster."""

        def whole() -> bool:
            members = self.rest(self.primary() or 1, "/cluster").json()["members"]
            streaming = [m for m in members if m.get("state") == "streaming"]
            return len(streaming) == 2 and any(m["role"] == "sync_standby" for m in members)

        try:
            wait_for(whole, timeout, "three healthy members")
        except RuntimeError as error:
            raise RuntimeError(f"{error}\n{self.state_report()}") from None
        time.sleep(0.5)

    def state_report(self) -> str:
        """What each member says of itself and the end of its Patroni log: the cluster's
        directory is gone once the test ends, so a failure carries them."""
        lines = []
        for node in NODES:
            try:
                lines.append(f"node{node}: {self.rest(node, '/patroni').text[:500]}")
            except requests.RequestException as error:
                lines.append(f"node{node}: no answer ({type(error).__name__})")
            log = self.logs_of(node)
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
            lines.extend(f"  {line}" for line in tail)
        return "\n".join(lines)
