"""No file git tracks keeps a merge's conflict markers: a half-resolved merge reads as text
(the docs' link test passed over one in docs/scaling.md)."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKERS = ("<<<<<<< ", ">>>>>>> ")


def leftovers(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        try:
            lines = path.read_text().splitlines(keepends=True)
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        opened = [n for n, line in enumerate(lines, 1) if line.startswith(MARKERS[0])]
        closed = [n for n, line in enumerate(lines, 1) if line.startswith(MARKERS[1])]
        if opened or closed:
            found.append(f"{path}:{(opened or closed)[0]}")
    return found


def tracked() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    return [ROOT / name.decode() for name in names if name and b"node_modules" not in name]


def test_no_tracked_file_has_conflict_markers() -> None:
    files = tracked()
    assert len(files) > 100  # the listing worked
    assert leftovers(files) == []


def test_a_conflict_left_in_a_file_is_found(tmp_path: Path) -> None:
    bad, good = tmp_path / "bad.md", tmp_path / "good.md"
    bad.write_text("a\n<<<<<<< HEAD\nours\n=======\ntheirs\n>>>>>>> branch\n")
    good.write_text("a heading\n=======\n")
    assert leftovers([bad, good]) == [f"{bad}:2"]
