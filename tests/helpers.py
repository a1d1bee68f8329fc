"""Assertions shared by the tests, for DRF's test client and requests alike (both responses have
status_code, headers and json())."""

from typing import Any


def _text(response: Any) -> str:
    raw = getattr(response, "content", b"")
    return raw.decode(errors="replace")[:500] if isinstance(raw, bytes) else str(raw)[:500]


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    """The contract's one error format (CONTRACT, Errors): status, a JSON body that is exactly
    {"error": {"code", "message", "details"}}, the given code, a human sentence and a details
    object. Returns the inner error for more specific checks."""
    assert response.status_code == status, (response.status_code, _text(response))
    assert response.headers["Content-Type"].startswith("application/json"), _text(response)
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


def commit_written(transaction_id: str) -> tuple[Any, ...]:
    """What a commit of the transaction wrote, comparable between two commits: the half's
    resolution, its commit-log row's copy of the message and its COMMIT op (ids and times
    compared within the transaction, not across)."""
    from apps.broker.models import CommitLogEntry, HalfMessage, OpRecord

    half = HalfMessage.objects.get(transaction_id=transaction_id)
    entry = CommitLogEntry.objects.get(transaction_id=transaction_id)
    [op] = OpRecord.objects.filter(half=half, op="COMMIT")
    assert entry.msg_id == half.msg_id
    assert entry.stored_at == half.resolved_at == op.at
    return (
        half.state,
        half.resolved_by,
        half.next_check_at,
        bytes(entry.body),
        entry.body_is_binary,
        entry.tags,
        entry.keys,
        entry.properties,
        entry.producer_group,
        entry.born_at == half.born_at,
        entry.queue_id == half.queue_id,
        op.source,
        op.actor,
        op.reason,
        op.detail,
    )
