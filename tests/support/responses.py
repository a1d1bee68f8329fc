"""Assertions on HTTP answers, for DRF's test client and requests alike (both responses have
status_code, headers, content and json())."""

from typing import Any


def _text(response: Any) -> str:
    raw = getattr(response, "content", b"")
    return raw.decode(errors="replace")[:500] if isinstance(raw, bytes) else str(raw)[:500]


def assert_error(
    response: Any, status: int, code: str, *, shorter_than: int | None = None
) -> dict[str, Any]:
    """The contract's one error format (CONTRACT, Errors): the status, a JSON content type
    (exactly `application/json`), a body that is exactly {"error": {"code", "message",
    "details"}}, the given code, a human sentence and a details object, and for a 503 a
    Retry-After; with `shorter_than`, a body of fewer bytes than that. Returns the inner error
    for more specific checks."""
    assert response.status_code == status, (response.status_code, _text(response))
    assert response.headers["Content-Type"] == "application/json", (
        response.headers["Content-Type"],
        _text(response),
    )
    if status == 503:  # every 503 says when to try again, in whole seconds (decision 0086)
        assert response.headers.get("Retry-After", "").isdigit(), dict(response.headers)
    if shorter_than is not None:
        assert len(response.content) < shorter_than, (len(response.content), _text(response))
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"code", "message", "details"}, error
    assert error["code"] == code, error
    assert isinstance(error["message"], str), error
    assert error["message"].strip(), error
    assert isinstance(error["details"], dict), error
    return dict(error)


def expect(response: Any, status: int) -> Any:
    """A setup or follow-up call that must succeed with this status; returns its JSON body (None
    for an empty one, e.g. a 204)."""
    assert response.status_code == status, (response.status_code, _text(response))
    return response.json() if _text(response) else None
