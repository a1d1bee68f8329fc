"""A process of the test's own whose clocks run ahead: Debian's libfaketime, preloaded. The one
place that finds the library, for chaos case F12 (tests/chaos/skew.py) and the skewed-clock
probes (tests/support/skewed_clock.py); docs/decisions/0020, 0102, 0116.

libfaketime is Debian's package `faketime`, which scripts/services.sh installs (`make test` runs
it first), under /usr/lib/<architecture>/faketime/."""

from pathlib import Path

LIBRARY = next(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"), Path("missing"))


def running_ahead(seconds: int) -> dict[str, str]:
    """The environment that makes a process's clocks (time.time, datetime.now, the monotonic
    clocks by a constant offset) run `seconds` ahead of this one's and of the database's."""
    assert LIBRARY.exists(), f"{LIBRARY} missing (Debian package faketime)"
    return {"LD_PRELOAD": str(LIBRARY), "FAKETIME": f"+{seconds}s"}
