"""A slow DNS for check URLs: a DNS server of the test's own (UDP and TCP on port 53 of a
127.0.0.x address) that answers A queries after a delay the test sets, or never, and the code
under test run in a process of the test's own (`manage.py shell -c`) whose /etc/resolv.conf
names that server. The process has a mount namespace of its own (`unshare --mount`, then a bind
mount over /etc/resolv.conf) and keeps the network namespace, so it still reaches Postgres,
Redis and the test's producers on 127.0.0.1. Its lookups are glibc's getaddrinfo, for real
(docs/decisions/0083, 0087, 0096).

The probes the process runs are tests/support/slow_dns_probes.py."""

import contextlib
import functools
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest

from apps.broker.models import ProducerGroup
from tests.conftest import ROOT, db_url_for_tests
from tests.support.transactions import make_group

DEADLINE = 1.0  # s: TXHUB_CHECK_HTTP_TIMEOUT while a slow DNS is armed
NEVER = None  # a delay: the query is never answered (until release())
SLOW_HOST = "slow-dns.invalid"  # a name real DNS does not know, nor /etc/hosts
RESULT = "SLOW-DNS-RESULT "  # the line of the probe's answer on its standard output
WAITING = "SLOW-DNS-WAITING"  # the line of a probe waiting for the test (see Probe.resume)
CHILD_SECONDS = 120  # a probe still running then has hung: it is killed and the test fails


def require_namespaces() -> None:
    """Skips the test, with the reason, where a mount namespace of its own cannot be made;
    fails it where the system's resolver would not ask the test's DNS server."""
    if os.geteuid() != 0:
        pytest.skip("a real slow DNS needs root (unshare --mount, mount --bind); CI runs as root")
    if shutil.which("unshare") is None:
        pytest.skip("a real slow DNS needs unshare (util-linux)")
    hosts = [
        line.split()[1:]
        for line in Path("/etc/nsswitch.conf").read_text().splitlines()
        if line.split()[:1] == ["hosts:"]
    ]
    assert hosts, "/etc/nsswitch.conf has no hosts line"
    assert "dns" in hosts[0], f"/etc/nsswitch.conf's hosts line asks no DNS: {hosts[0]}"
    assert SLOW_HOST not in Path("/etc/hosts").read_text(), f"{SLOW_HOST} is in /etc/hosts"


def slow_group(url: str, name: str = "shop") -> Any:
    """A producer group whose check URL is `url` (on 127.0.0.1) with SLOW_HOST for its host:
    registered at 127.0.0.1, then renamed in the database (this process's lookups are the
    system's, which do not know SLOW_HOST)."""
    group = make_group(url, name=name)
    ProducerGroup.objects.filter(pk=group.pk).update(check_url=url.replace("127.0.0.1", SLOW_HOST))
    group.refresh_from_db()
    return group


def _name_in(query: bytes) -> str:
    labels, at = [], 12
    while query[at] != 0:
        labels.append(query[at + 1 : at + 1 + query[at]].decode(errors="replace"))
        at += query[at] + 1
    return ".".join(labels)


def _asks_for_a(query: bytes) -> bool:
    at = 12
    while query[at] != 0:
        at += query[at] + 1
    return bool(struct.unpack("!H", query[at + 1 : at + 3])[0] == 1)


def _answer(query: bytes, addresses: list[str]) -> bytes:
    """The answer to `query`: the IPv4 `addresses` to an A query, the IPv6 ones to an AAAA
    query, no record to any other."""
    (query_id, flags) = struct.unpack("!HH", query[:4])
    end = 12
    while query[end] != 0:
        end += query[end] + 1
    question = query[12 : end + 5]
    (query_type,) = struct.unpack("!H", query[end + 1 : end + 3])
    family = {1: socket.AF_INET, 28: socket.AF_INET6}.get(query_type)
    records = [
        struct.pack("!HHHIH", 0xC00C, query_type, 1, 0, len(data)) + data
        for data in (
            socket.inet_pton(family, address)
            for address in addresses
            if family is not None and (":" in address) == (family == socket.AF_INET6)
        )
    ]
    header = struct.pack("!HHHHHH", query_id, 0x8180 | (flags & 0x0100), 1, len(records), 0, 0)
    return header + question + b"".join(records)


class SlowDns:
    """The test's DNS server. arm(seconds, *addresses): every query from now on is answered
    `seconds` after it came (NEVER: not at all), with `addresses`; release(): every query still
    waiting is answered now, and so is every later one."""

    def __init__(self, tmp: Path) -> None:
        self.delay: float | None = 0.0
        self.addresses = ["127.0.0.1"]
        self.queries = 0
        self.asked: list[str] = []  # the name of each A query, in order
        self._lock = threading.Lock()
        self._held: list[Callable[[], None]] = []
        self._closed = threading.Event()
        self.host = self._bind()
        self.resolv_conf = tmp / "resolv.conf"
        # One server, one try, glibc's longest wait (30 s): a query never answered is a lookup
        # that hangs, as a dead DNS server makes it.
        self.resolv_conf.write_text(f"nameserver {self.host}\noptions timeout:30 attempts:1\n")
        for serve in (self._serve_udp, self._serve_tcp):
            threading.Thread(target=serve, daemon=True).start()

    def _bind(self) -> str:
        for last in range(2, 250):
            host = f"127.0.53.{last}"
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                udp.bind((host, 53))
                tcp.bind((host, 53))
            except OSError:
                udp.close()
                tcp.close()
                continue
            tcp.listen()
            self._udp, self._tcp = udp, tcp
            return host
        raise AssertionError("no 127.0.53.x address has port 53 free")

    def arm(self, seconds: float | None, *addresses: str) -> None:
        """Answers from now on: `addresses` (127.0.0.1 if none), after `seconds` (NEVER: not
        until release())."""
        with self._lock:
            self.delay, self.addresses = seconds, list(addresses or ["127.0.0.1"])

    def release(self) -> None:
        with self._lock:
            self.delay = 0.0
            held, self._held = self._held, []
        for send in held:
            send()

    def _later(self, send_answer: Callable[[bytes], object], query: bytes) -> None:
        came = time.monotonic()
        with self._lock:
            self.queries += 1
            if _asks_for_a(query):
                self.asked.append(_name_in(query))
            delay, addresses = self.delay, self.addresses

        def send() -> None:
            with contextlib.suppress(OSError):  # the asker gave up, or the server is closed
                send_answer(_answer(query, addresses))

        if delay is None:
            with self._lock:
                self._held.append(send)
            return
        timer = threading.Timer(max(0.0, came + delay - time.monotonic()), send)
        timer.daemon = True
        timer.start()

    def _serve_udp(self) -> None:
        while not self._closed.is_set():
            try:
                query, peer = self._udp.recvfrom(4096)
            except OSError:
                return
            self._later(functools.partial(self._send_to, peer), query)

    def _send_to(self, peer: tuple[str, int], answer: bytes) -> None:
        self._udp.sendto(answer, peer)

    def _serve_tcp(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._tcp.accept()
            except OSError:
                return
            threading.Thread(target=self._serve_stream, args=(connection,), daemon=True).start()

    def _serve_stream(self, connection: socket.socket) -> None:
        reader = connection.makefile("rb")
        while True:
            size = reader.read(2)
            if len(size) < 2:
                return
            query = reader.read(struct.unpack("!H", size)[0])
            self._later(
                lambda answer: connection.sendall(struct.pack("!H", len(answer)) + answer), query
            )

    def close(self) -> None:
        self._closed.set()
        self._udp.close()
        self._tcp.close()

    def start(self, probe: str, env: dict[str, Any] | None = None, **args: Any) -> "Probe":
        """`probe` (a function of tests/support/slow_dns_probes.py, called with `args`) run in
        a process of its own whose DNS is this server."""
        return Probe(self.resolv_conf, probe, {k: str(v) for k, v in (env or {}).items()}, args)

    def run(self, probe: str, env: dict[str, Any] | None = None, **args: Any) -> Any:
        """What `probe` returned, once its process has ended."""
        return self.start(probe, env, **args).result()


class Probe:
    def __init__(
        self, resolv_conf: Path, probe: str, env: dict[str, str], args: dict[str, Any]
    ) -> None:
        code = "from tests.support.slow_dns_probes import main; main()"
        self.process = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "sh",
                "-c",
                'mount --bind "$0" /etc/resolv.conf && exec "$@"',
                str(resolv_conf),
                sys.executable,
                "manage.py",
                "shell",
                "-c",
                code,
            ],
            cwd=ROOT,
            env={
                **os.environ,
                "DATABASE_URL": db_url_for_tests(),
                "TXHUB_CHECK_HTTP_TIMEOUT": str(DEADLINE),
                **env,
                "TXHUB_SLOW_DNS_PROBE": json.dumps({"probe": probe, "args": args}),
            },
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []

    def _stdout(self) -> IO[str]:
        assert self.process.stdout is not None
        return self.process.stdout

    def wait_for_pause(self) -> None:
        """Returns once the probe waits for the test (it printed WAITING)."""
        for line in self._stdout():
            self.lines.append(line)
            if line.strip() == WAITING:
                return
        raise AssertionError(f"the probe ended without waiting: {self.lines}")

    def resume(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def result(self) -> Any:
        try:
            rest, _ = self.process.communicate(timeout=CHILD_SECONDS)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        self.lines += rest.splitlines()
        assert self.process.returncode == 0, f"the probe failed: {self.lines}"
        [answer] = [line[len(RESULT) :] for line in self.lines if line.startswith(RESULT)]
        return json.loads(answer)


class Answer:
    """A probe's HTTP answer, for tests/support/responses.py's assertions."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.status_code: int = answer["status_code"]
        self.headers: dict[str, str] = answer["headers"]
        self.content = answer["content"].encode()
        self.took: float = answer["took"]
        self.seen: list[str] = answer.get("seen", [])
        self.looked_up: bool = answer.get("looked_up", False)

    def json(self) -> Any:
        return json.loads(self.content)
