"""A TCP proxy of the tests' own that puts faults between two real peers (this kernel has no
`tc netem` and no iptables): answers lost after the server did the work, delay, and resets."""

import random
import socket
import struct
import threading
import time

from tests.support.proxy import TcpProxy, pipe


class FaultProxy(TcpProxy):
    """Forwards 127.0.0.1:<port> to `upstream`. Faults, each changeable while running:

    - drop_answers: the next N answers are swallowed: the request was forwarded, and the client's
      connection closes once the answer starts (work done, answer lost: what a crash between
      commit and answer looks like from the client);
    - delay: seconds added (uniform between delay - jitter and delay + jitter) before forwarding;
    - reset_share: that share of new connections is reset at once (RST, nothing forwarded).
    """

    def __init__(self, upstream: tuple[str, int], *, seed: int = 0) -> None:
        self.drop_answers = 0
        self.dropped = 0
        self.delay = 0.0
        self.jitter = 0.0
        self.reset_share = 0.0
        self.resets = 0
        self.connections = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        super().__init__(upstream)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def serve(self, client: socket.socket) -> None:
        with self._lock:
            self.connections += 1
            reset = self._rng.random() < self.reset_share
            delay = max(0.0, self.delay + self._rng.uniform(-self.jitter, self.jitter))
        if reset:
            self.resets += 1
            # Linger on, timeout 0: close() sends a RST instead of a FIN.
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
            return
        if delay:
            time.sleep(delay)
        try:
            server = socket.create_connection(self.upstream, timeout=30)
        except OSError:
            client.close()
            return
        threading.Thread(target=pipe, args=(client, server), daemon=True).start()
        pipe(server, client, self._swallow)

    def _swallow(self, chunk: bytes) -> bool:
        """True for the start of an answer while answers are to be dropped (on any connection,
        keep-alive ones included)."""
        if not chunk.startswith(b"HTTP/"):
            return False
        with self._lock:
            if self.drop_answers <= 0:
                return False
            self.drop_answers -= 1
            self.dropped += 1
            return True
