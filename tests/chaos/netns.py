"""A host of the test's own behind a veth pair in a network namespace (root only): setting the
namespace's end down turns its address into a black hole (SYNs vanish, nothing answers), which
no process on the loopback can imitate."""

import secrets
import subprocess
import sys
import time

from tests.chaos.cluster import ROOT, wait_for


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Namespace:
    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.name = f"txhub-chaos-{tag}"
        self.host_if, self.ns_if = f"vh{tag}", f"vn{tag}"  # interface names: 15 bytes at most
        octet = int(tag[:2], 16)
        self.host_ip, self.ns_ip = f"10.213.{octet}.1", f"10.213.{octet}.2"
        self.processes: list[subprocess.Popen[bytes]] = []

    def up(self) -> None:
        _ip("netns", "add", self.name)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        _ip("link", "set", self.ns_if, "netns", self.name)
        _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        self._in("addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
        self._in("link", "set", self.ns_if, "up")
        self._in("link", "set", "lo", "up")

    def _in(self, *args: str) -> None:
        _ip("netns", "exec", self.name, "ip", *args)

    def check_endpoint(self, port: int = 8080) -> str:
        """The chaos check endpoint, run inside the namespace; returns its URL."""
        process = subprocess.Popen(
            ["ip", "netns", "exec", self.name, sys.executable, "-m", "tests.chaos.workload"]
            + [self.ns_ip, str(port)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.processes.append(process)
        url = f"http://{self.ns_ip}:{port}/check"
        import socket

        def answers() -> bool:
            with socket.create_connection((self.ns_ip, port), timeout=1):
                return True

        wait_for(answers, 20, "the check endpoint in the namespace")
        return url

    def black_hole(self) -> None:
        self._in("link", "set", self.ns_if, "down")

    def heal(self) -> None:
        self._in("link", "set", self.ns_if, "up")
        time.sleep(0.5)

    def delete(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
        subprocess.run(["ip", "netns", "del", self.name], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", self.host_if], check=False, capture_output=True)
