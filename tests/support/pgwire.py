"""A Postgres proxy of the tests' own that counts the statements a server sends, per kind of
connection, as they pass: an exact count of what one server asked, which Postgres's own
statistics (per database, every session's, reported up to 10 s late) cannot give.

Frontend protocol (PostgreSQL's "Message Formats"): after the untyped start-up packets (an
SSLRequest or GSSENCRequest, each answered with one byte, then the StartupMessage), every message
is a type byte and a length that counts itself. A statement is one Query ('Q', the simple
protocol) or one Execute ('E', the extended protocol psycopg uses). A connection whose first
statement text says LISTEN is a wake-up connection (apps/broker/wakeups.py); the others are the
pool's. The server must connect with sslmode=disable and gssencmode=disable: an encrypted stream
cannot be read."""

import contextlib
import socket
import struct
import threading
from collections import Counter

from tests.support.proxy import TcpProxy, pipe

_NEGOTIATIONS = {80877103, 80877104}  # SSLRequest, GSSENCRequest: answered with one byte
STATEMENTS = {b"Q", b"E"}


class StatementCounter(TcpProxy):
    """Forwards 127.0.0.1:<port> to `upstream`, counting statements into `counts["listen"]` and
    `counts["pool"]`. Any failure to read the stream is recorded in `errors` (a test reads it: a
    count the proxy could not make is not zero)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []
        self._lock = threading.Lock()
        super().__init__(upstream)

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)

    def serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream, timeout=30)
        except OSError as error:
            self.errors.append(f"upstream: {error}")
            client.close()
            return
        server.settimeout(None)
        threading.Thread(target=pipe, args=(server, client), daemon=True).start()
        try:
            self._read_frontend(client, server)
        except OSError:  # either side closed: the connection's end, not a misread
            pass
        except Exception as error:  # noqa: BLE001 - recorded for the test, which fails on it
            self.errors.append(repr(error))
        finally:
            for sock in (client, server):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _read_frontend(self, client: socket.socket, server: socket.socket) -> None:
        while True:  # start-up: untyped packets
            packet = _read_exactly(client, 4)
            packet += _read_exactly(client, struct.unpack("!I", packet)[0] - 4)
            server.sendall(packet)
            if struct.unpack_from("!I", packet, 4)[0] not in _NEGOTIATIONS:
                break
        kind = ""
        while True:
            head = _read_exactly(client, 5)
            body = _read_exactly(client, struct.unpack_from("!I", head, 1)[0] - 4)
            server.sendall(head + body)
            tag = head[:1]
            if not kind and tag in (b"Q", b"P"):
                text = body.split(b"\0", 2)[1 if tag == b"P" else 0]
                kind = "listen" if text.lstrip().upper().startswith(b"LISTEN") else "pool"
            if tag in STATEMENTS:
                with self._lock:
                    self.counts[kind or "pool"] += 1
            elif tag == b"X":  # Terminate
                return


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionResetError("closed")
        data += chunk
    return data
