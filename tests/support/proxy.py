"""What the tests' TCP proxies share: a listener on 127.0.0.1 that serves each connection in a
thread of its own, and a copy from one socket to the other."""

import contextlib
import socket
import threading
from collections.abc import Callable


class TcpProxy:
    """Accepts on 127.0.0.1:<port> (a free port) until closed; `serve(client)` runs in a thread
    per connection."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        """Stops accepting at once: without the shutdown, an accept() already waiting in its
        thread would still take one more connection after the close."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()

    def serve(self, client: socket.socket) -> None:
        raise NotImplementedError

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(client,), daemon=True).start()


def pipe(
    source: socket.socket, sink: socket.socket, drop: Callable[[bytes], bool] | None = None
) -> None:
    """Copies until either side closes; `drop(chunk)` true: closes both instead."""
    try:
        while chunk := source.recv(65536):
            if drop is not None and drop(chunk):
                break
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
