"""Each answer of the web server leaves in one write (txhub/worker.py, decision 0029).

Against the real server started as `make run` starts it (the `gunicorn` fixture): a client on a
kept-alive connection asks N times and reads each answer whole; Linux counts, on the client's
socket, the segments that carried data (TCP_INFO's tcpi_data_segs_in). uvicorn's own protocol
sends the header and the body of an answer in two writes, two segments; ours in one. Both doors
are asked: the lean door (a prepare) and Django's (the health check, a 404).
"""

import json
import socket
from typing import Any

from tests.conftest import Server
from tests.support.tcp import data_segments_in


def read_answer(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in lines if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        body += chunk
    assert len(body) == length, "no more than the answer came"
    return int(lines[0].split()[1]), body


def ask(port: int, requests: list[bytes]) -> tuple[list[int], int]:
    """Sends the requests one after the other on one connection, reading each answer whole;
    returns the statuses and the number of data segments the answers came in."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        before = data_segments_in(sock)
        statuses = []
        for request in requests:
            sock.sendall(request)
            statuses.append(read_answer(sock)[0])
        return statuses, data_segments_in(sock) - before


def request(method: str, path: str, headers: dict[str, str], body: Any = None) -> bytes:
    raw = b"" if body is None else json.dumps(body).encode()
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append(f"Content-Length: {len(raw)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + raw


def test_every_answer_is_one_segment(server: Server) -> None:
    headers = {**server.token("admin"), "Content-Type": "application/json"}
    port = int(server.base.rsplit(":", 1)[1])
    setup = [
        request("POST", "/api/v1/topics", headers, {"name": "one-write", "queues": 2}),
        request(
            "POST",
            "/api/v1/producer-groups",
            headers,
            {"name": "one-write", "check_url": "https://127.0.0.1:9/"},
        ),
    ]
    assert ask(port, setup)[0] == [201, 201]

    prepare = request(
        "POST",
        "/api/v1/transactions",
        headers,
        {"producer_group": "one-write", "topic": "one-write", "body": "x"},
    )
    asked = [prepare] * 10 + [request("GET", "/healthz", {})] * 5
    asked += [request("GET", "/no-such-page", {})] * 5
    statuses, segments = ask(port, asked)
    assert statuses == [201] * 10 + [200] * 5 + [404] * 5
    assert segments == len(asked)
