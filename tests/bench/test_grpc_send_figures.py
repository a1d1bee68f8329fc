"""bench/grpc_send.py's own arithmetic: the quantiles it prints and the ratios it divides."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

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
