"""One JSON request on a connection of its own, written and read as raw HTTP/1.1: many of them
at once from one event loop, as the long-poll tests hold hundreds of waits without a client
library's pool in the way."""

import asyncio
import json
import time
from typing import Any


async def json_request(
    port: int, method: str, path: str, headers: dict[str, str], body: Any
) -> tuple[int, Any, float]:
    """(status, JSON answer, `time.monotonic()` when the answer was read)."""
    payload = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n{head}\r\n".encode()
            + payload
        )
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return status, json.loads(await reader.readexactly(length)), time.monotonic()
    finally:
        writer.close()
