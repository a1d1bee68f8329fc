from typing import Any

import pytest
import requests

from tests.conftest import Server
from tests.support.responses import expect


@pytest.fixture
def shop(server: Server) -> dict[str, Any]:
    """On the real server: "orders", the producer group "shop", the consumer group "billing" and
    a token for both; the server's URL, the raw token and the group's signing secret."""
    admin = server.token("admin")
    s = requests.Session()
    s.headers.update(admin)
    expect(s.post(server.url("/api/v1/topics"), json={"name": "orders", "queues": 2}), 201)
    group = expect(
        s.post(
            server.url("/api/v1/producer-groups"),
            json={"name": "shop", "check_url": "http://127.0.0.1:9/"},
        ),
        201,
    )
    expect(s.post(server.url("/api/v1/consumer-groups"), json={"name": "billing"}), 201)
    token = server.token("produce:shop", "consume:billing")["Authorization"].split()[1]
    return {"url": server.base, "token": token, "secret": group["signing_secret"]}
