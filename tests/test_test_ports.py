"""The tests' servers listen on ports below the kernel's ephemeral range (tests/support/ports.py):
one picked from that range could be taken by an outgoing connection's source port before the
server binds it (a Patroni replica binds seconds after the pick)."""

import socket

import pytest

from tests.support import ports


def test_picked_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    low, _ = ports.ephemeral_range()
    picked = ports.free_ports(40)
    assert len(set(picked)) == 40
    assert all(ports.LOWEST <= port < low for port in picked), picked
    assert not set(picked) & ports.RESERVED
    for port in picked:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free now: this would raise otherwise


def _three_free_ports_in_a_row() -> int:
    for first in range(ports.LOWEST, ports.ephemeral_range()[0] - 3):
        held = []
        try:
            for port in range(first, first + 3):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise AssertionError("no three free ports in a row")


def test_a_port_someone_listens_on_or_a_taken_one_is_never_picked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = _three_free_ports_in_a_row()
    monkeypatch.setattr(ports, "LOWEST", first)
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (first + 3, 60999))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", first))
        listener.listen()
        # Positive control: with nothing else in the way, the other two are what is left.
        assert sorted(ports.free_ports(2)) == [first + 1, first + 2]
        assert ports.free_ports(1, taken={first + 1}) == [first + 2]
        with pytest.raises(RuntimeError, match="fewer than 3 free ports"):
            ports.free_ports(3)
