"""The floor under the gRPC door's CPU per message (issue 28, docs/decisions/0067): what a door on
grpc.aio would spend on bench/grpc_send.py's workload if it cost nothing beyond the framework
and the work each call must do, measured in the same run.

A message of that workload is one SendMessage, one AckMessage of one handle (the official client
acks one message per call) and a 32nd of a ReceiveMessage that streams 32 messages. The floor
adds up, per message:
- grpc.aio's own CPU for two empty unary calls and a 32nd of a call that streams 34 answers (32
  messages, a status and a timestamp), with the official client's metadata: a server on uvloop
  (the loop `manage.py grpcserver` runs, with grpc's default options) answering from bytes, in a
  child process this module starts (`python bench/grpc_floor.py [PORT]`, which prints its port);
- each RPC's synchronous part as the door runs it in its one thread hop (authentication and the
  rate limit's count, the service call, the answers built by the door's own code), with its
  request decoded and its answers encoded: called here, on this thread, with the requests the
  official client sends, made before the clock runs. It calls the door's internals on purpose:
  they are what is measured.

Left out, so a door doing the same work spends more: the hop to the executor and the pool's
connection checkout around it, what the event loop does beyond an empty call, heartbeats,
Telemetry and route queries, and contention under load. One caveat: the empty calls are made
one at a time to an idle server, where a loaded one may share some wake-ups between calls.

A library of grpc_send.py, which prints its line.
"""

import asyncio
import os
import select
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import cpu
import grpc
import grpc_rpcs

BATCH = 32  # what the workload's consumers ask one receive for (grpc_send.py uses it)
STREAMED = BATCH + 2  # and what such a receive streams: the messages, a status, a timestamp
ANSWER = b"x" * 300  # about one streamed message's size
SERVICE = "txhub.bench.Floor"
# A request as the wire brings it: its message class, its bytes, the client's signed metadata.
Wire = tuple[Any, bytes, list[tuple[str, str]]]


@dataclass(frozen=True)
class Floor:
    """ms of CPU: grpc.aio's per empty call, and each RPC's synchronous part."""

    unary: float
    stream: float  # a call that streams STREAMED answers
    send: float  # SendMessage of one message
    ack: float  # AckMessage of one handle
    receive: float  # ReceiveMessage of BATCH messages

    @property
    def framework(self) -> float:
        """grpc.aio's own part of one message."""
        return 2 * self.unary + self.stream / BATCH

    @property
    def per_message(self) -> float:
        return self.framework + self.send + self.ack + self.receive / BATCH


def measure(*, keys: dict[str, str], topic: str, group: str, calls: int) -> Floor:
    """`calls` sends and acks, receives of BATCH for those messages (rounded up to whole
    receives: a few more messages are sent, not counted), `5 * calls` empty calls and `calls`
    streams. `topic` is new and `group` consumes it."""
    metadata = grpc_rpcs.metadata(keys)
    unary, stream = _framework(metadata, unary_calls=5 * calls, stream_calls=calls)
    send, ack, receive = _synchronous_parts(keys, topic, group, calls)
    return Floor(unary=unary, stream=stream, send=send, ack=ack, receive=receive)


def _framework(
    metadata: list[tuple[str, str]], *, unary_calls: int, stream_calls: int
) -> tuple[float, float]:
    child = subprocess.Popen(
        [sys.executable, __file__], stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(__file__)
    )
    try:
        port = _port_of(child)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            empty = channel.unary_unary(f"/{SERVICE}/Empty")
            streamed = channel.unary_stream(f"/{SERVICE}/Stream")

            def one_unary() -> None:
                empty(b"request", metadata=metadata)

            def one_stream() -> None:
                answers = sum(1 for _ in streamed(b"request", metadata=metadata))
                if answers != STREAMED:
                    raise RuntimeError(f"floor server streamed {answers}, not {STREAMED}")

            for _ in range(20):  # the channel up and both handlers run once
                one_unary()
                one_stream()
            return _child_ms(child.pid, unary_calls, one_unary), _child_ms(
                child.pid, stream_calls, one_stream
            )
    finally:
        child.kill()
        child.wait()


def _port_of(child: subprocess.Popen[str], wait: float = 30.0) -> int:
    """The port the child prints once it listens, or a clear error if it never does."""
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], wait)
    line = child.stdout.readline() if ready else ""
    if not line.strip().isdigit():
        raise RuntimeError(f"the floor's server did not start (exit code {child.poll()})")
    return int(line)


def _child_ms(pid: int, calls: int, call: Callable[[], None]) -> float:
    before = cpu.process_ms(pid)
    for _ in range(calls):
        call()
    return (cpu.process_ms(pid) - before) / calls


def _synchronous_parts(
    keys: dict[str, str], topic: str, group: str, calls: int
) -> tuple[float, float, float]:
    """(send, ack, receive of BATCH) ms of this thread's CPU per call, as the hop runs them. The
    requests and their signed metadata are made before the clock runs: they are the client's."""
    from apps.broker.grpc import producers
    from apps.broker.grpc.consumers import _first_try, answers_of
    from apps.broker.grpc.protocol import Code
    from apps.broker.grpc.resources import counted_caller
    from apps.broker.grpc.servicer import MessagingService

    door = MessagingService(process="bench-floor")

    def wire(request: Any) -> Wire:
        return type(request), request.SerializeToString(), grpc_rpcs.metadata(keys)

    def hop(fn: Callable[..., Any], request: Wire, *args: Any) -> Any:
        """`fn` as the door's hop runs it (resources.as_caller), on the request off the wire."""
        kind, body, metadata = request
        return fn(counted_caller(dict(metadata)), kind.FromString(body), *args)

    def answered(answer: Any, what: str) -> None:
        if answer.status.code != Code.OK:
            raise RuntimeError(f"floor {what}: {answer.status.code} {answer.status.message}")
        answer.SerializeToString()

    def send(request: Wire) -> None:
        answered(hop(producers.send, request), "SendMessage")

    handles: list[tuple[str, str]] = []

    def receive(request: Wire) -> None:
        _, found, seconds, received, _ = hop(_first_try, request, None)
        if len(received) != BATCH:
            raise RuntimeError(f"floor receive: {len(received)} messages, not {BATCH}")
        for answer in answers_of(received, topic=found.name, invisible_seconds=seconds):
            answer.SerializeToString()
        handles.extend((item.message.msg_id, item.receipt_handle) for item in received)

    def ack(request: Wire) -> None:
        answered(hop(door._ack, request), "AckMessage")

    def sends(count: int) -> list[Wire]:
        return [wire(grpc_rpcs.send_request(topic)) for _ in range(count)]

    def receives(count: int) -> list[Wire]:
        return [wire(grpc_rpcs.receive_request(topic, group, BATCH)) for _ in range(count)]

    def acks(count: int) -> list[Wire]:
        taken, handles[:count] = handles[:count], []
        return [wire(grpc_rpcs.ack_request(topic, group, *handle)) for handle in taken]

    # Warm, one of each kind: the topic's and the group's caches, the group's cursors.
    _thread_ms(sends(BATCH), send)
    _thread_ms(receives(1), receive)
    _thread_ms(acks(1), ack)
    handles.clear()
    send_ms = _thread_ms(sends(calls), send)
    rounds = -(-calls // BATCH)  # whole receives for every message just sent
    _thread_ms(sends(rounds * BATCH - calls), send)
    receive_ms = _thread_ms(receives(rounds), receive)
    return send_ms, _thread_ms(acks(calls), ack), receive_ms


def _thread_ms(requests: list[Wire], call: Callable[[Wire], None]) -> float:
    """ms of this thread's CPU per request, `call` on each."""
    before = time.thread_time()
    for request in requests:
        call(request)
    return (time.thread_time() - before) * 1000 / max(1, len(requests))


# The child: grpc.aio on uvloop answering from bytes ------------------------------------------


async def _empty(request: bytes, context: Any) -> bytes:
    return ANSWER[:10]


async def _stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
    for _ in range(STREAMED):
        yield ANSWER


async def _serve(port: int = 0) -> None:
    """Serve on 127.0.0.1:`port` (0: a free one) and print the port once listening."""
    server = grpc.aio.server()
    handlers = {
        "Empty": grpc.unary_unary_rpc_method_handler(_empty),
        "Stream": grpc.unary_stream_rpc_method_handler(_stream),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
