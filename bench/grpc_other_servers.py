"""What an empty gRPC call costs the server on servers other than grpc.aio (issue 28,
docs/decisions/0105): is a gRPC front that is not Python's cheap enough to matter?

Four servers, each a child process started in turn on 127.0.0.1 and driven by the same client
(grpc's synchronous Python client, one channel, the official client's metadata as
bench/grpc_floor.py sends it), answering bench/grpc_floor.py's methods from bytes:

  a  grpc.aio on uvloop: grpc_floor.py's own server, the loop `manage.py grpcserver` runs;
  b  Node's @grpc/grpc-js (bench/node/server.js);
  c  grpc's synchronous Python server with a thread pool, for reference (decision 0059);
  d  the Node server of (b) forwarding each Empty call to a keep-alive HTTP/1.1 endpoint that
     answers an empty 200 (a Python asyncio protocol on uvloop, a process of its own): what a
     Node front that hands each call to a Python worker spends on its side, with the endpoint's
     CPU beside it.

For each: 200 warm-up calls, then `--calls` Empty calls one at a time, the same number from
`--callers` threads at once, and (not d) `--streams` Stream calls of 34 answers of 300 bytes one
at a time. The server's CPU (utime + stime from /proc/PID/stat) is read around each part: µs
per call, the kernel's share of it, and calls/s. `--rounds` rounds, the servers interleaved
(a b c d a b c d ...), medians. The client runs on the same cores, so calls/s says less than
the CPU does.

    cd bench/node && npm ci        # once: @grpc/grpc-js into bench/node/node_modules
    .venv/bin/python bench/grpc_other_servers.py            # about a minute
"""

import argparse
import asyncio
import select
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import cpu
import grpc
import grpc_floor
import grpc_rpcs

HERE = Path(__file__).resolve().parent
NODE = HERE / "node"
# The servers do not check the signature; the metadata only has the official client's size.
KEYS = {"access_key": "bench-access-key", "secret_key": "bench-secret-key"}
SYNC_WORKERS = 10  # the synchronous server's pool: more than the callers, so none waits


@dataclass(frozen=True)
class Server:
    key: str
    label: str
    command: Callable[[int, int], list[str]]  # (its port, the endpoint's port) -> argv
    cwd: Path = HERE
    forwards: bool = False  # (d): an HTTP endpoint of its own is started first
    streams: bool = True


SERVERS = (
    Server("a", "grpc.aio on uvloop", lambda port, _: [sys.executable, "grpc_floor.py", str(port)]),
    Server("b", "@grpc/grpc-js (Node)", lambda port, _: ["node", "server.js", str(port)], NODE),
    Server(
        "c",
        "grpc sync server, thread pool",
        lambda port, _: [sys.executable, Path(__file__).name, "--serve-sync", str(port)],
    ),
    Server(
        "d",
        "@grpc/grpc-js forwarding to HTTP",
        lambda port, endpoint: ["node", "server.js", str(port), str(endpoint)],
        NODE,
        forwards=True,
        streams=False,
    ),
)
FIGURES = {
    "one_us": "one at a time, server µs/call",
    "one_kernel_pct": "one at a time, % of it in the kernel",
    "one_rate": "one at a time, calls/s",
    "many_us": "concurrent, server µs/call",
    "many_kernel_pct": "concurrent, % of it in the kernel",
    "many_rate": "concurrent, calls/s",
    "stream_us": "stream of 34, server µs/call",
    "endpoint_one_us": "HTTP endpoint, one at a time, µs/call",
    "endpoint_many_us": "HTTP endpoint, concurrent, µs/call",
}


@dataclass(frozen=True)
class Settings:
    calls: int
    warm: int
    callers: int
    streams: int


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--warm", type=int, default=200)
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=50150, help="the gRPC servers' port")
    parser.add_argument("--endpoint-port", type=int, help="(d)'s HTTP endpoint's; --port + 1")
    parser.add_argument("--only", default="a,b,c,d", help="which servers, e.g. a,b")
    args = parser.parse_args()
    servers = [server for server in SERVERS if server.key in args.only.split(",")]
    if any(server.cwd == NODE for server in servers) and not (NODE / "node_modules").is_dir():
        sys.exit("bench/node/node_modules is missing: run `npm ci` in bench/node first")
    settings = Settings(args.calls, args.warm, args.callers, args.streams)
    readings: dict[str, list[dict[str, float]]] = {server.key: [] for server in servers}
    for round_number in range(1, args.rounds + 1):
        for server in servers:
            endpoint_port = args.endpoint_port or args.port + 1
            figures = measure(server, settings, port=args.port, endpoint_port=endpoint_port)
            readings[server.key].append(figures)
            shown = ", ".join(f"{name} {value:.0f}" for name, value in figures.items())
            print(f"round {round_number} {server.key} ({server.label}): {shown}", flush=True)
    print(
        f"\nmedians of {args.rounds} rounds; {args.calls} calls after {args.warm}, "
        f"{args.callers} concurrent callers, {args.streams} streams"
    )
    for server in servers:
        print(f"{server.key}  {server.label}")
        for name, label in FIGURES.items():
            values = [figures[name] for figures in readings[server.key] if name in figures]
            if values:
                each = " / ".join(f"{value:.0f}" for value in values)
                print(f"   {label:<40} {statistics.median(values):>7.0f}   ({each})")


def measure(server: Server, settings: Settings, *, port: int, endpoint_port: int) -> dict[str, Any]:
    """One server's figures, from a fresh process (and a fresh endpoint for (d))."""
    with _child(server.command(port, endpoint_port), server.cwd) as pid:
        if not server.forwards:
            return _drive(port, pid, None, settings, server.streams)
        endpoint = [sys.executable, Path(__file__).name, "--serve-http", str(endpoint_port)]
        with _child(endpoint, HERE) as endpoint_pid:
            return _drive(port, pid, endpoint_pid, settings, server.streams)


class _child:
    """A server process that has printed its port, killed on the way out."""

    def __init__(self, command: list[str], cwd: Path) -> None:
        self.command, self.cwd = command, cwd

    def __enter__(self) -> int:
        self.process = subprocess.Popen(
            self.command, cwd=self.cwd, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 30.0)
        line = self.process.stdout.readline() if ready else ""
        if not line.strip().isdigit():
            self.__exit__()
            raise RuntimeError(f"{' '.join(self.command)} did not start: {line!r}")
        return self.process.pid

    def __exit__(self, *_: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _drive(
    port: int, pid: int, endpoint_pid: int | None, settings: Settings, streams: bool
) -> dict[str, float]:
    metadata = grpc_rpcs.metadata(KEYS)
    figures: dict[str, float] = {}
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        empty = channel.unary_unary(f"/{grpc_floor.SERVICE}/Empty")
        streamed = channel.unary_stream(f"/{grpc_floor.SERVICE}/Stream")

        def one_empty() -> None:
            empty(b"request", metadata=metadata)

        def one_stream() -> None:
            answers = sum(1 for _ in streamed(b"request", metadata=metadata))
            if answers != grpc_floor.STREAMED:
                raise RuntimeError(f"port {port} streamed {answers}, not {grpc_floor.STREAMED}")

        for _ in range(settings.warm):
            one_empty()
        for _ in range(20 if streams else 0):
            one_stream()
        pids = [pid] if endpoint_pid is None else [pid, endpoint_pid]
        for part, callers in (("one", 1), ("many", settings.callers)):
            with _cpu(pids) as spent:
                seconds = _timed(one_empty, settings.calls, callers)
            (server_ms, kernel_ms), *endpoint = spent
            figures[f"{part}_us"] = server_ms * 1000 / settings.calls
            figures[f"{part}_kernel_pct"] = kernel_ms * 100 / max(server_ms, 1e-9)
            figures[f"{part}_rate"] = settings.calls / seconds
            if endpoint:
                figures[f"endpoint_{part}_us"] = endpoint[0][0] * 1000 / settings.calls
        if streams:
            with _cpu([pid]) as spent:
                _timed(one_stream, settings.streams, 1)
            figures["stream_us"] = spent[0][0] * 1000 / settings.streams
    return figures


class _cpu:
    """(ms of CPU, ms of it in the kernel) each process spent inside the block, in the list it
    yields once the block ends. The kernel's part: over loopback, a send does the receiver's TCP
    work too (decision 0059), so it shows how much of a call is the socket's, not the server's."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.spent: list[tuple[float, float]] = []

    def __enter__(self) -> list[tuple[float, float]]:
        self.before = [_user_system_ms(pid) for pid in self.pids]
        return self.spent

    def __exit__(self, *_: object) -> None:
        after = [_user_system_ms(pid) for pid in self.pids]
        for (user, system), (user_end, system_end) in zip(self.before, after, strict=True):
            self.spent.append((user_end - user + system_end - system, system_end - system))


def _user_system_ms(pid: int) -> tuple[float, float]:
    """A process's utime and stime, ms (fields 14 and 15 of proc(5)); cpu.process_ms's sum
    adds its waited-for children's, and these servers have none."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) * 1000 / cpu.TICKS, int(fields[12]) * 1000 / cpu.TICKS


def _timed(call: Callable[[], None], calls: int, callers: int) -> float:
    """Seconds for `calls` calls made by `callers` threads at once (one: this thread)."""
    if callers == 1:
        started = time.perf_counter()
        for _ in range(calls):
            call()
        return time.perf_counter() - started
    shares = [calls // callers + (1 if index < calls % callers else 0) for index in range(callers)]
    gate = threading.Barrier(callers + 1)

    def caller(share: int) -> None:
        gate.wait()
        for _ in range(share):
            call()

    threads = [threading.Thread(target=caller, args=(share,)) for share in shares]
    for thread in threads:
        thread.start()
    gate.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


# The children: (c) grpc's synchronous server, (d)'s HTTP endpoint ---------------------------


def _serve_sync(port: int) -> None:
    def empty(request: bytes, context: Any) -> bytes:
        return grpc_floor.ANSWER[:10]

    def stream(request: bytes, context: Any) -> Iterator[bytes]:
        for _ in range(grpc_floor.STREAMED):
            yield grpc_floor.ANSWER

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=SYNC_WORKERS))
    handlers = {
        "Empty": grpc.unary_unary_rpc_method_handler(empty),
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(grpc_floor.SERVICE, handlers),)
    )
    print(server.add_insecure_port(f"127.0.0.1:{port}"), flush=True)
    server.start()
    server.wait_for_termination()


class _EmptyOk(asyncio.Protocol):
    """HTTP/1.1 keep-alive: an empty 200 for each request (its body read by Content-Length)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCP transport is not a subclass of asyncio.Transport, but is one.
        self.transport, self.buffer = cast(asyncio.Transport, transport), b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            length = 0
            for line in self.buffer[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")


async def _serve_http(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_EmptyOk, "127.0.0.1", port)
    print(port, flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-sync"]:
        _serve_sync(int(sys.argv[2]))
    elif sys.argv[1:2] == ["--serve-http"]:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve_http(int(sys.argv[2])))
    else:
        main()
