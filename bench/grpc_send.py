"""gRPC door vs REST: messages/s sent and consumed end to end, same workload through each door.

Through gRPC with the official RocketMQ Python client (rocketmq-python-client, pinned): N
threads, each with its own Producer, `send` a normal message per round trip for `--seconds`; two
SimpleConsumers `receive` (32, waiting up to 1 s) and `ack` each message (the client acks one by
one). Through REST with plain HTTP: N threads `POST /topics/{t}/messages`; two consumers receive
32 and ack them in one request. messages/s = messages / time to the last ack. Runs against a
running `make run` (web on --url, gRPC on --grpc); `make bench` calls it and prints its lines.

Then the same workload through REST once more, its consumers acking each message in a request
of its own as the official client does: the two doors compared like for like. Then each hot call
alone (bench/grpc_rpcs.py, bench/rest_calls.py): the gRPC door's CPU per call beside the lean
REST door's for the same call.

Beside the rates: each door's machine CPU per message, split into the bench's own process (the
clients), the server's part, Postgres and the rest, with the ceiling it sets (every core busy
through the run at that CPU per message); the round trips of a send and of a gRPC ack; and how
much of the load the consumers had taken when the producers stopped (decision 0066).

    .venv/bin/python bench/grpc_send.py --url http://127.0.0.1:8000 --grpc 127.0.0.1:8081
"""

import argparse
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import cpu  # noqa: E402
import grpc_floor  # noqa: E402
import grpc_rpcs  # noqa: E402
import rest_calls  # noqa: E402
from http_client import Client  # noqa: E402

BODY = rest_calls.BODY.encode()


def setup(name: str) -> tuple[str, dict[str, str]]:
    """Topic, groups and one token (one produce scope: a RocketMQ producer's group) with keys."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")
    import django

    django.setup()
    from apps.broker.services import credentials, registry

    registry.topic_create(name=name, queues=4)
    registry.producer_group_create(name=name)
    registry.consumer_group_create(name=name, max_delivery_attempts=16, consume_from="first")
    token, raw = registry.token_create(
        name="bench-grpc", scopes=[f"produce:{name}", f"consume:{name}"]
    )
    return raw, credentials.of(token)


@dataclass
class Load:
    rate: float  # messages / seconds to the last ack
    produced: int
    sends: list[float]  # each send's round trip, seconds
    # Messages consumed when the producers stopped: counted per batch acked, and the sends that
    # finish after the stop count as produced, so it reads a few points low.
    acked_when_stopped: int
    stopped_at: float  # time.perf_counter() when the producers were told to stop


def run(
    producers: int,
    seconds: float,
    make_producer: Callable[[], Any],
    make_consumer: Callable[[], Any],
) -> Load:
    """make_producer() -> (send(), close()); make_consumer() -> (take() -> count, close()).
    A client that cannot start breaks the start barrier: the run fails with its error."""
    produced = received = 0
    lock = threading.Lock()
    stop, done = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    last = [0.0]
    sends: list[float] = []
    ready = threading.Barrier(producers + 2 + 1)

    def started(make: Callable[[], Any]) -> Any:
        try:
            return make()
        except BaseException as error:  # reported after the run, never swallowed
            errors.append(error)
            ready.abort()
            return None

    def produce() -> None:
        nonlocal produced
        client = started(make_producer)
        if client is None:
            return
        send, close = client
        mine: list[float] = []
        try:
            ready.wait()
            while not stop.is_set():
                began = time.perf_counter()
                send()
                mine.append(time.perf_counter() - began)
                with lock:
                    produced += 1
        except BaseException as error:
            errors.append(error)
        finally:
            close()
            with lock:
                sends.extend(mine)

    def consume() -> None:
        nonlocal received
        client = started(make_consumer)
        if client is None:
            return
        take, close = client
        try:
            ready.wait()
            while True:
                with lock:
                    if done.is_set() and received >= produced:
                        return
                n = take()
                if n:
                    with lock:
                        received += n
                        last[0] = time.perf_counter()
                elif errors:
                    return
        except BaseException as error:
            errors.append(error)
        finally:
            close()

    threads = [threading.Thread(target=produce) for _ in range(producers)]
    threads += [threading.Thread(target=consume) for _ in range(2)]
    for thread in threads:
        thread.start()
    began = time.perf_counter()
    try:
        ready.wait()  # client start-up (routes, settings) is not counted
    except threading.BrokenBarrierError:
        stop.set()
        done.set()
    else:
        began = time.perf_counter()
        time.sleep(seconds)
        stop.set()
    stopped_at = time.perf_counter()
    with lock:
        acked_when_stopped = received
    for thread in threads[:producers]:
        thread.join()
    done.set()
    for thread in threads[producers:]:
        thread.join()
    if errors:
        first = next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), None)
        first = first or errors[0]
        raise RuntimeError(f"load failed: {first!r}") from first
    rate = produced / (max(last[0], began + seconds) - began)
    return Load(rate, produced, sends, acked_when_stopped, stopped_at)


def measured(data_dir: str, load: Callable[[], Load]) -> tuple[Load, dict[str, float]]:
    """The load, and CPU per message by part (ms, bench/cpu.py), client start-up included (as
    many RPCs a client makes once, in both doors' runs): the server's parts, the bench's own
    process ("client": the clients it runs, not its /proc reads) and the whole machine
    ("machine", /proc/stat, less the bench's reads after the load)."""
    before = cpu.sample(ROOT, data_dir)
    own_before = cpu.own_ms()
    result = load()
    own_after = cpu.own_ms()
    after = cpu.sample(ROOT, data_dir)
    spent = cpu.delta(before, after)
    spent["client"] = own_after - own_before
    reading = after.own_ms - own_after
    spent["machine"] = after.system_busy_ms - before.system_busy_ms - reading
    return result, {part: ms / max(result.produced, 1) for part, ms in spent.items()}


def budget(cpu_per_message: dict[str, float], server: str, label: str) -> str:
    """Where a message's machine CPU went, and the ceiling it sets: the messages/s every core
    of this machine busy through the run would carry at that CPU per message. The parts come
    from /proc per process and the machine from /proc/stat: a negative rest is noise, flagged."""
    parts = cpu_per_message
    rest = parts["machine"] - parts["client"] - parts[server] - parts["postgres"]
    cores = cpu.cores()
    ceiling = f"{cores * 1000 / parts['machine']:.0f}" if parts["machine"] > 0 else "n/a"
    noise = " (negative: the two readings disagree, read as noise)" if rest < 0 else ""
    return (
        f"machine {parts['machine']:.2f} ms (bench client {parts['client']:.2f}, {label} "
        f"{parts[server]:.2f}, Postgres {parts['postgres']:.2f}, rest {rest:.2f}{noise}) "
        f"-> ceiling {ceiling} messages/s on {cores} cores"
    )


def quantiles(seconds: list[float]) -> str:
    """p50 (the median) and p99 by nearest rank."""
    if not seconds:
        return "none"
    ordered = sorted(seconds)
    p99 = ordered[max(0, math.ceil(len(ordered) * 0.99) - 1)]
    return f"p50 {1000 * statistics.median(ordered):.1f} / p99 {1000 * p99:.1f} ms"


def ratio(part: float, whole: float, *, percent: bool = False) -> str:
    if whole <= 0:
        return "n/a"
    return f"{100 * part / whole:.0f} %" if percent else f"{part / whole:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=f"http://127.0.0.1:{os.environ.get('TXHUB_PORT', '8000')}")
    parser.add_argument("--grpc", default=f"127.0.0.1:{os.environ.get('TXHUB_GRPC_PORT', '8081')}")
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument(
        "--rpc-calls", type=int, default=200, help="calls of each hot call, per door, alone"
    )
    args = parser.parse_args()
    from rocketmq import (
        ClientConfiguration,
        Credentials,
        FilterExpression,
        Message,
        Producer,
        SimpleConsumer,
    )

    name = f"bench-grpc-{int(time.time())}"
    token, keys = setup(name)
    config = ClientConfiguration(args.grpc, Credentials(keys["access_key"], keys["secret_key"]))

    def grpc_producer() -> Any:
        producer = Producer(config, (name,))
        producer.startup()
        message = Message()
        message.topic = name
        message.body = BODY
        return (lambda: producer.send(message)), producer.shutdown

    # Each gRPC ack's (start, round trip); list.append is one call, safe across threads.
    acks: list[tuple[float, float]] = []

    def grpc_consumer() -> Any:
        consumer = SimpleConsumer(config, name, {name: FilterExpression("*")}, 1)
        consumer.startup()

        def take() -> int:
            batch = consumer.receive(grpc_floor.BATCH, 30) or []
            for item in batch:
                began = time.perf_counter()
                consumer.ack(item)
                acks.append((began, time.perf_counter() - began))
            return len(batch)

        return take, consumer.shutdown

    base = f"{args.url}/api/v1"

    def rest_door(topic: str, *, one_by_one: bool) -> tuple[Callable[[], Any], Callable[[], Any]]:
        """REST's producers and consumers on `topic`; the consumers ack what they received in
        one request, or (`one_by_one`) each message in a request of its own, as the official
        RocketMQ client does."""

        def producer() -> Any:
            client = Client(base, token)
            payload = {"producer_group": name, "body": rest_calls.BODY}
            return (lambda: client.post(f"/topics/{topic}/messages", payload)), lambda: None

        def consumer() -> Any:
            client = Client(base, token)
            receive = {"topic": topic, "max_messages": grpc_floor.BATCH, "wait_seconds": 1}
            ack = f"/consumer-groups/{name}/ack"

            def take() -> int:
                batch = client.post(f"/consumer-groups/{name}/receive", receive)["messages"]
                handles = [m["receipt_handle"] for m in batch]
                if one_by_one:
                    for handle in handles:
                        client.post(ack, {"receipt_handles": [handle]})
                elif handles:
                    client.post(ack, {"receipt_handles": handles})
                return len(batch)

            return take, lambda: None

        return producer, consumer

    from apps.broker.services import registry

    registry.topic_create(name=f"{name}-rest", queues=4)  # same shape, its own offsets
    registry.topic_create(name=f"{name}-rest-one", queues=4)
    registry.topic_create(name=f"{name}-rpc", queues=4)
    registry.topic_create(name=f"{name}-calls", queues=4)
    registry.topic_create(name=f"{name}-floor", queues=4)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW data_directory")
        data_dir = os.path.realpath(str(cursor.fetchone()[0]))
    connection.close()
    grpc_load, grpc_cpu = measured(
        data_dir, lambda: run(args.producers, args.seconds, grpc_producer, grpc_consumer)
    )
    rest_producer, rest_consumer = rest_door(f"{name}-rest", one_by_one=False)
    rest_load, rest_cpu = measured(
        data_dir, lambda: run(args.producers, args.seconds, rest_producer, rest_consumer)
    )
    one_producer, one_consumer = rest_door(f"{name}-rest-one", one_by_one=True)
    one_load, one_cpu = measured(
        data_dir, lambda: run(args.producers, args.seconds, one_producer, one_consumer)
    )
    print(
        f"gRPC door, send + receive + ack, {args.producers} producers, {args.seconds:g} s: "
        f"{grpc_load.rate:8.1f} messages/s (official Python client) vs REST "
        f"{rest_load.rate:8.1f} messages/s ({ratio(grpc_load.rate, rest_load.rate, percent=True)})"
    )
    print(
        f"gRPC door server CPU per message: gRPC processes {grpc_cpu['grpc']:.2f} ms, Postgres "
        f"{grpc_cpu['postgres']:.2f} ms vs REST web {rest_cpu['web']:.2f} ms, Postgres "
        f"{rest_cpu['postgres']:.2f} ms (gRPC/web {ratio(grpc_cpu['grpc'], rest_cpu['web'])})"
    )
    print(f"gRPC door machine CPU per message: {budget(grpc_cpu, 'grpc', 'gRPC processes')}")
    print(f"REST machine CPU per message: {budget(rest_cpu, 'web', 'web')}")

    def consumed(load: Load) -> str:
        return ratio(load.acked_when_stopped, load.produced, percent=True)

    while_sending = [took for began, took in acks if began < grpc_load.stopped_at]
    after_sending = [took for began, took in acks if began >= grpc_load.stopped_at]
    print(
        f"gRPC door round trips: send {quantiles(grpc_load.sends)}; ack of one while the "
        f"producers sent {quantiles(while_sending)}, after {quantiles(after_sending)}; "
        f"consumed when the producers stopped {consumed(grpc_load)} "
        f"(REST: send {quantiles(rest_load.sends)}; {consumed(rest_load)})"
    )
    print(
        f"REST acking one message per request, as the official client: "
        f"{one_load.rate:.1f} messages/s, web {one_cpu['web']:.2f} ms, Postgres "
        f"{one_cpu['postgres']:.2f} ms per message; the gRPC door at "
        f"{ratio(grpc_load.rate, one_load.rate, percent=True)} of its messages/s and "
        f"{ratio(grpc_cpu['grpc'], one_cpu['web'])} its web CPU per message; "
        f"{budget(one_cpu, 'web', 'web')}"
    )
    grpc_per_call = grpc_rpcs.per_rpc(
        endpoint=args.grpc,
        keys=keys,
        topic=f"{name}-rpc",
        group=name,
        calls=args.rpc_calls,
        data_dir=data_dir,
    )
    print(
        f"gRPC door CPU per call ({args.rpc_calls} calls each, gRPC processes + Postgres): "
        + ", ".join(
            f"{rpc} {grpc_per_call[rpc][0]:.2f} + {grpc_per_call[rpc][1]:.2f} ms"
            for rpc in grpc_rpcs.HOT
        )
    )
    rest_per_call = rest_calls.per_call(
        base=base,
        token=token,
        topic=f"{name}-calls",
        group=name,
        calls=args.rpc_calls,
        data_dir=data_dir,
    )
    print(
        f"REST lean door CPU per call ({args.rpc_calls} calls each, web + Postgres): "
        + ", ".join(
            f"{call} {rest_per_call[call][0]:.2f} + {rest_per_call[call][1]:.2f} ms"
            for call, _ in rest_calls.PAIRS
        )
    )
    # The gRPC send carries the client's own message id, which costs a lookup REST's does not
    # make (services/client_ids.py): the official client always sends one.
    print(
        "gRPC door / REST lean door per call, server processes (and Postgres): "
        + ", ".join(
            f"{rpc} {ratio(grpc_per_call[rpc][0], rest_per_call[call][0])} "
            f"({ratio(grpc_per_call[rpc][1], rest_per_call[call][1])})"
            for call, rpc in rest_calls.PAIRS
        )
    )

    floor = grpc_floor.measure(keys=keys, topic=f"{name}-floor", group=name, calls=args.rpc_calls)
    print(floor_line(floor, grpc_ms=grpc_cpu["grpc"], web_ms=rest_cpu["web"]))


def floor_line(floor: grpc_floor.Floor, *, grpc_ms: float, web_ms: float) -> str:
    """The floor under the gRPC processes' CPU per message beside issue 28's target (1.3x the
    web tier's, batched REST), and what the load spent above it: the door's own cost and the
    calls the floor leaves out (decision 0067)."""
    batch = grpc_floor.BATCH
    target = 1.3 * web_ms
    room = target - floor.per_message
    left = (
        f"the target leaves {room:.2f} ms above it"
        if room >= 0
        else f"the target is {-room:.2f} ms below the floor"
    )
    return (
        f"gRPC door floor per message: {floor.per_message:.2f} ms = grpc.aio alone "
        f"{floor.framework:.2f} (empty call {floor.unary:.2f} x 2, stream of "
        f"{grpc_floor.STREAMED} answers {floor.stream:.2f} / {batch}) + synchronous parts: send "
        f"{floor.send:.2f} + ack {floor.ack:.2f} + receive of {batch} {floor.receive:.2f} / "
        f"{batch}; {ratio(floor.per_message, web_ms)} REST's web per message, target 1.30x "
        f"({target:.2f} ms); the gRPC processes spent {grpc_ms:.2f} ms, "
        f"{grpc_ms - floor.per_message:.2f} ms above the floor, and {left}"
    )


if __name__ == "__main__":
    main()
