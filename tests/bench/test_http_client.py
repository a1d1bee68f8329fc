"""bench/http_client.py, the load generator's hand-written HTTP/1.1 client: against the real
server (answers read whole across keep-alive requests; that the lean door takes them is in
tests/broker/test_lean_door.py), and
against canned answers for what it must refuse rather than guess."""

import socket
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Server

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import produce_consume  # noqa: E402
from http_client import Client  # noqa: E402


def test_a_message_made_and_taken_through_the_client(server: Server) -> None:
    _, raw = server.token("admin")["Authorization"].split(" ")
    base = server.url("/api/v1")
    produce_consume.make_topic(base, raw, "bench-client")
    client = Client(base, raw)
    for _ in range(3):  # one keep-alive connection for all of them
        assert produce_consume.single(client, "bench-client") == 1
    receive = {"topic": "bench-client", "max_messages": 32, "wait_seconds": 1}
    messages = client.post("/consumer-groups/bench-client/receive", receive)["messages"]
    assert [m["body"] for m in messages] == ["bench message body"] * 3
    handles = [m["receipt_handle"] for m in messages]
    acked = client.post("/consumer-groups/bench-client/ack", {"receipt_handles": handles})
    assert sorted(acked["acked"]) == sorted(handles)
    assert acked["invalid"] == []
    with pytest.raises(RuntimeError, match="404"):
        client.post("/consumer-groups/no-such-group/receive", receive)


def _serve(listener: socket.socket, answers: list[bytes], seen: dict[str, Any]) -> None:
    """Answers each request with the next canned answer, written in two pieces (the client must
    read across recv() boundaries); closes the connection after an answer that says so. Counts
    the connections; an exception is kept for the test to raise."""
    try:
        while answers:
            conn, _ = listener.accept()
            seen["connections"] += 1
            with conn:
                while answers and conn.recv(65536):
                    answer = answers.pop(0)
                    conn.sendall(answer[:20])
                    conn.sendall(answer[20:])
                    if b"Connection: close" in answer or b"X-Then: hang-up" in answer:
                        break  # the second: closed without a word, as a keep-alive timeout does
    except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
        seen["error"] = error


def test_keep_alive_a_close_and_an_answer_without_a_length() -> None:
    answers = [
        b'HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n{"a": 1}',
        b'HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\n{"b": 2}',
        b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nX-Then: hang-up\r\n\r\n{}",
        b'HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n{"c": 3}',
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    ]
    with socket.create_server(("127.0.0.1", 0)) as listener:
        seen: dict[str, Any] = {"connections": 0, "error": None}
        serving = threading.Thread(target=_serve, args=(listener, answers, seen), daemon=True)
        serving.start()
        client = Client(f"http://127.0.0.1:{listener.getsockname()[1]}/api/v1", "t")
        assert client.post("/x") == {"a": 1}
        assert client.post("/x") == {"b": 2}  # on the same connection
        assert client.sock is None  # closed as the server said; the next call connects again
        assert client.post("/x") == {}
        assert client.post("/x") == {"c": 3}  # sent again on a new connection
        with pytest.raises(RuntimeError, match="without Content-Length"):
            client.post("/x")
        serving.join(timeout=5)
        assert not serving.is_alive()
        if seen["error"] is not None:
            raise seen["error"]
        assert not answers  # five answers to five requests,
        assert seen["connections"] == 3  # on three connections: kept alive, closed, hung up
