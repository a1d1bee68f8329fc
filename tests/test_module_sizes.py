"""No module over 500 lines in txhub's code (issue 26): a module that long holds more than one
concern, and a reader has to find the one they came for. Migrations are generated and excepted."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("apps", "txhub", "spark_jobs")
MOST_LINES = 500


def too_long(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, int]:
    """The modules below `root`'s packages (migrations aside) longer than MOST_LINES: their
    paths, relative to `root`, and how many lines each has."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" in path.relative_to(root).parts:
                continue
            lines = len(path.read_text().splitlines())
            if lines > MOST_LINES:
                found[str(path.relative_to(root))] = lines
    return found


def test_the_count_sees_a_module_one_line_too_long(tmp_path: Path) -> None:
    """The positive control: 501 lines are found, 500 are not, nor a long migration."""
    (tmp_path / "apps" / "app" / "migrations").mkdir(parents=True)
    (tmp_path / "apps" / "app" / "long.py").write_text("x = 1\n" * (MOST_LINES + 1))
    (tmp_path / "apps" / "app" / "fits.py").write_text("x = 1\n" * MOST_LINES)
    (tmp_path / "apps" / "app" / "migrations" / "0001_initial.py").write_text("x = 1\n" * 900)
    assert too_long(tmp_path, ("apps",)) == {"apps/app/long.py": MOST_LINES + 1}


def test_no_module_is_over_500_lines() -> None:
    assert (ROOT / "apps" / "broker" / "models.py").exists()  # the count is the code's
    assert too_long(ROOT) == {}
