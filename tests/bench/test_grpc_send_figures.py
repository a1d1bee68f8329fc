"""bench/grpc_send.py's own arithmetic: the quantiles it prints and the ratios it divides."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import grpc_floor  # noqa: E402
import grpc_send  # noqa: E402


def test_p99_is_the_nearest_rank() -> None:
    # 100 round trips of 1..100 ms: the 99th smallest is the p99, not the largest.
    assert grpc_send.quantiles([ms / 1000 for ms in range(1, 101)]) == "p50 50.5 / p99 99.0 ms"
    assert grpc_send.quantiles([0.004]) == "p50 4.0 / p99 4.0 ms"
    assert grpc_send.quantiles([]) == "none"


def test_a_ratio_over_nothing_is_not_a_number() -> None:
    assert grpc_send.ratio(3.0, 2.0) == "1.50x"
    assert grpc_send.ratio(1.0, 4.0, percent=True) == "25 %"
    assert grpc_send.ratio(1.0, 0.0) == "n/a"


def test_the_floor_adds_two_calls_a_send_an_ack_and_a_32nd_of_a_receive() -> None:
    floor = grpc_floor.Floor(unary=0.3, stream=3.2, send=0.6, ack=0.4, receive=6.4)
    assert floor.framework == pytest.approx(2 * 0.3 + 3.2 / 32)
    assert floor.per_message == pytest.approx(0.7 + 0.6 + 0.4 + 6.4 / 32)
    line = grpc_send.floor_line(floor, grpc_ms=3.0, web_ms=1.5)
    assert line.startswith("gRPC door floor per message: 1.90 ms = grpc.aio alone 0.70 ")
    assert "1.27x REST's web per message, target 1.30x (1.95 ms)" in line
    assert line.endswith(
        "the gRPC processes spent 3.00 ms, 1.10 ms above the floor, and the target leaves "
        "0.05 ms above it"
    )
    below = grpc_send.floor_line(floor, grpc_ms=3.0, web_ms=1.4)
    assert below.endswith("the target is 0.08 ms below the floor")
