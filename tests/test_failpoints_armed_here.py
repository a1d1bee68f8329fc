"""A failpoint armed in a test's own process (docs/decisions/0098): the site runs the test's
step while the block is open, and is unarmed again after it, as it was before."""

import pytest

from apps.broker import failpoints


def test_a_site_armed_here_runs_its_step_only_inside_the_block() -> None:
    assert not failpoints.ARMED  # TXHUB_FAILPOINTS is unset in the tests
    steps: list[str] = []
    with failpoints.armed_here("after_msg_id_check", lambda: steps.append("ran")):
        assert failpoints.ARMED
        failpoints.hit("after_msg_id_check")
        failpoints.hit("after_half_insert")  # another site: nothing
    assert steps == ["ran"]
    assert not failpoints.ARMED
    failpoints.hit("after_msg_id_check")
    assert steps == ["ran"]


def test_a_site_is_unarmed_again_when_its_step_raises() -> None:
    def fails() -> None:
        raise RuntimeError("the step's own failure")

    with (
        pytest.raises(RuntimeError),
        failpoints.armed_here("during_check_call", fails),
    ):
        failpoints.hit("during_check_call")
    assert not failpoints.ARMED
    failpoints.hit("during_check_call")


def test_an_unknown_site_or_one_armed_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="no failpoint site"):
        failpoints.armed_here("after_everything", lambda: None).__enter__()
    with failpoints.armed_here("after_ack_before_answer", lambda: None):
        with pytest.raises(ValueError, match="armed here already"):
            failpoints.armed_here("after_ack_before_answer", lambda: None).__enter__()
        assert failpoints.ARMED
    assert not failpoints.ARMED
