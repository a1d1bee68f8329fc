"""The clients of a chaos run: producers that send and run transactions with unique bodies, the
producer's check-back endpoint (it answers what the producer's local transaction decided), and
consumers of one group that receive and ack. Each body says what should become of it:

    "<process>-<seq>|SEND"              a plain send
    "<process>-<seq>|COMMIT|producer"   prepared, then committed by the producer
    "<process>-<seq>|ROLLBACK|producer" prepared, then rolled back by the producer
    "<process>-<seq>|COMMIT|abandon"    prepared and left: check-back is answered COMMIT
    "<process>-<seq>|ROLLBACK|abandon"  ... answered ROLLBACK
    "<process>-<seq>|UNKNOWN|abandon"   ... answered UNKNOWN until txhub parks it

With `groups`, every send and prepare names one of that many message groups and the consumer
group is FIFO (issue 29); consumers can then be killed (kill_consumer) at the points a process
dies: before reading a receive's answer, between a receive and its ack, before an ack's answer.
"""

import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests

from tests.chaos.history import History, Op, call

KINDS = [
    ("SEND", None, 30),
    ("COMMIT", "producer", 35),
    ("ROLLBACK", "producer", 15),
    ("COMMIT", "abandon", 8),
    ("ROLLBACK", "abandon", 6),
    ("UNKNOWN", "abandon", 6),
]


def _unknown_or_unsent(op: Op) -> bool:
    """Worth retrying: the outcome is unknown, or the request never reached txhub (a refused
    connection) or was throttled."""
    return op.type == "info" or (op.type == "fail" and op.result.get("status") in {None, 429})


def intent_of(body: str) -> tuple[str, str | None]:
    parts = body.split("|")
    return parts[1], (parts[2] if len(parts) > 2 else None)


class CheckEndpoint:
    """The producer's check URL: answers the decision written in the transaction's body."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.checks = 0
        # When each transaction's first check arrived, by this (the producer's) clock.
        self.first_check: dict[str, float] = {}

        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                check = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.checks += 1
                endpoint.first_check.setdefault(check.get("transaction_id", ""), time.time())
                state = intent_of(check.get("body", "x|UNKNOWN"))[0]
                answer = json.dumps({"state": state}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}/check"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Workload:
    def __init__(
        self, base: str, token: str, history: History, *, name: str, seed: int, groups: int = 0
    ) -> None:
        # Each fault gets a topic and groups of its own, so one cluster serves a whole run.
        self.topic, self.producer, self.consumer = name, f"{name}-producer", f"{name}-consumer"
        self.api = base + "/api/v1"
        self.headers = {"Authorization": f"Bearer {token}"}
        self.history = history
        self.seed = seed
        self.groups = groups
        self.kills: dict[str, threading.Event] = {}  # consumer name -> asked to die
        self.producing = threading.Event()
        self.consuming = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def setup(self, check_url: str, queues: int = 4) -> None:
        for path, payload in [
            ("/topics", {"name": self.topic, "queues": queues}),
            ("/producer-groups", {"name": self.producer, "check_url": check_url}),
            (
                "/consumer-groups",
                {"name": self.consumer, "max_delivery_attempts": 1000}
                | ({"fifo": True} if self.groups else {}),
            ),
        ]:
            response = requests.post(
                self.api + path, json=payload, headers=self.headers, timeout=10
            )
            assert response.status_code == 201, response.text

    # Threads --------------------------------------------------------------------------------

    def start(self, producers: int, consumers: int) -> None:
        self.producing.set()
        self.consuming.set()
        for n in range(producers):
            self._thread(self._producer, f"p{n}")
        for n in range(consumers):
            self._start_consumer(f"c{n}")

    def _start_consumer(self, name: str) -> None:
        self.kills[name] = threading.Event()
        self._thread(self._consumer, name)

    def kill_consumer(self, victim: str) -> str:
        """The consumer dies at its next kill point (what it held comes back after its invisible
        time); a new one takes its place. Returns the new one's name."""
        self.kills[victim].set()
        replacement = f"c{len(self.kills)}"
        self._start_consumer(replacement)
        return replacement

    def live_consumers(self) -> list[str]:
        return [name for name, killed in self.kills.items() if not killed.is_set()]

    def _thread(self, target: Any, name: str) -> None:
        def run() -> None:
            try:
                target(name)
            except BaseException as error:  # kept and re-raised by join(): never swallowed
                self.errors.append(error)
                raise

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def stop_producers(self) -> None:
        self.producing.clear()
        for thread in self.threads:
            if thread.name.startswith("p"):
                thread.join(timeout=120)

    def stop_consumers(self) -> None:
        self.consuming.clear()
        for thread in self.threads:
            thread.join(timeout=60)
        if self.errors:
            raise RuntimeError(f"a client thread failed: {self.errors[0]!r}") from self.errors[0]

    # Producers ------------------------------------------------------------------------------

    def _producer(self, name: str) -> None:
        rng = random.Random(f"{self.seed}-{name}")
        session = requests.Session()
        seq = 0
        while self.producing.is_set():
            seq += 1
            intent, mode = rng.choices([k[:2] for k in KINDS], weights=[k[2] for k in KINDS])[0]
            body = f"{name}-{seq}|{intent}" + (f"|{mode}" if mode else "")
            group = f"g{rng.randrange(self.groups)}" if self.groups else ""
            if intent == "SEND":
                self._post(session, name, "send", f"/topics/{self.topic}/messages", body, group)
                continue
            prepared = self._post(session, name, "prepare", "/transactions", body, group)
            if prepared.type != "ok" or mode == "abandon":
                continue
            transaction_id = prepared.result["body"]["transaction_id"]
            outcome = "commit" if intent == "COMMIT" else "rollback"
            self._resolve(session, name, outcome, transaction_id, body)

    def _post(
        self, session: requests.Session, name: str, f: str, path: str, body: str, group: str = ""
    ) -> Op:
        """A send or prepare with an Idempotency-Key, retried while its outcome is unknown: the
        retry answers the first answer if the first was stored, so nothing is stored twice."""
        payload: dict[str, Any] = {"producer_group": self.producer, "body": body}
        if group:
            payload["message_group"] = group
        if f == "prepare":
            payload["topic"] = self.topic
        headers = {**self.headers, "Idempotency-Key": body.replace("|", ".")}
        deadline = time.monotonic() + 60
        while True:
            op = call(
                session,
                self.history,
                name,
                f,
                self.api + path,
                payload,
                value={"body": body, **({"group": group} if group else {})},
                headers=headers,
            )
            if not _unknown_or_unsent(op) or time.monotonic() > deadline:
                return op
            time.sleep(0.2)

    def _resolve(
        self, session: requests.Session, name: str, outcome: str, transaction_id: str, body: str
    ) -> None:
        """Retried while the outcome is unknown: a repeated resolution answers the first one."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            op = call(
                session,
                self.history,
                name,
                outcome,
                f"{self.api}/transactions/{transaction_id}/{outcome}",
                {},
                value={"body": body, "transaction_id": transaction_id},
                headers=self.headers,
            )
            if not _unknown_or_unsent(op):
                return
            time.sleep(0.2)

    # Consumers ------------------------------------------------------------------------------

    def _consumer(self, name: str) -> None:
        rng = random.Random(f"{self.seed}-{name}")
        session = requests.Session()
        killed = self.kills[name]
        while self.consuming.is_set() and not killed.is_set():
            op = call(
                session,
                self.history,
                name,
                "receive",
                f"{self.api}/consumer-groups/{self.consumer}/receive",
                {
                    "topic": self.topic,
                    "max_messages": 16,
                    "invisible_seconds": 10,
                    "wait_seconds": 1,
                },
                value={},
                headers=self.headers,
                timeout=10,
            )
            if op.type != "ok":
                time.sleep(0.2)
                continue
            # Now and then a message is not acked: it must come back after its invisible time.
            handles = [
                m["receipt_handle"] for m in op.result["body"]["messages"] if rng.random() > 0.03
            ]
            if killed.is_set() and handles:
                self._die(session, name, op, handles, rng.choice(["answer", "ack", "ack answer"]))
                return
            if handles:
                self._ack(session, name, handles)
        session.close()

    def _die(
        self, session: requests.Session, name: str, receive: Op, handles: list[str], point: str
    ) -> None:
        """A consumer killed before it read the receive's answer (in the history: the outcome
        unknown, its messages never seen), before its ack, or before the ack's answer."""
        if point == "answer":
            self.history.complete(receive, "info", {"error": "killed before the answer"})
        elif point == "ack answer":
            op = self._ack_once(session, name, handles, None)
            self.history.complete(op, "info", {"error": "killed before the answer"})
        session.close()

    def _ack(self, session: requests.Session, name: str, handles: list[str]) -> None:
        """An ack whose outcome is unknown is sent again: the retry acks what the first did not,
        and answers `invalid` for what the first one did ack (the checker reads that)."""
        first = None
        for _ in range(10):
            op = self._ack_once(session, name, handles, first)
            if not _unknown_or_unsent(op):
                return
            first = op.index if first is None else first
            time.sleep(0.2)

    def _ack_once(
        self, session: requests.Session, name: str, handles: list[str], retry_of: int | None
    ) -> Op:
        return call(
            session,
            self.history,
            name,
            "ack",
            f"{self.api}/consumer-groups/{self.consumer}/ack",
            {"receipt_handles": handles},
            value={"receipt_handles": handles, "retry_of": retry_of},
            headers=self.headers,
        )


def serve_forever() -> None:
    """`python -m tests.chaos.workload HOST PORT`: the check endpoint as a process of its own
    (the black-hole case runs it inside a network namespace)."""
    import sys

    endpoint = CheckEndpoint(sys.argv[1], int(sys.argv[2]))
    print(endpoint.url, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    serve_forever()
