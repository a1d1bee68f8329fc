"""The documentation holds together (issue 26): every relative link in README.md and in docs/
reaches a file that exists, every #anchor a heading of the page it names (GitHub's heading slugs),
and the README stays a front door of at most 300 lines. Needs no database."""

import unicodedata
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300
PARSER = MarkdownIt("commonmark").enable("table")


@pytest.fixture(autouse=True)
def fresh_configuration_epoch() -> None:
    """Overrides conftest's: these tests read files only, and need no Redis."""


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (github-slugger): lower case, every character but
    letters, marks, digits, `_`, `-` and spaces dropped, each space a `-`."""
    kept = "".join(
        char
        for char in heading.strip().lower()
        if char in "_- " or unicodedata.category(char)[0] in "LMN"
    )
    return kept.replace(" ", "-")


def plain_text(inline: Token) -> str:
    """What a heading reads as once rendered: its text and code, without the markup."""
    return "".join(
        child.content for child in inline.children or [] if child.type in {"text", "code_inline"}
    )


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a page's headings; a repeated heading gets -1, -2, ..."""
    tokens = PARSER.parse(path.read_text())
    seen: dict[str, int] = {}
    found: set[str] = set()
    for opening, inline in zip(tokens, tokens[1:], strict=False):
        if opening.type != "heading_open":
            continue
        slug = github_slug(plain_text(inline))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def link_targets(path: Path) -> Iterator[str]:
    """Every link and image target in the page's markdown (not in code)."""
    for token in PARSER.parse(path.read_text()):
        for child in token.children or []:
            if child.type == "link_open":
                yield str(child.attrs["href"])
            elif child.type == "image":
                yield str(child.attrs["src"])


def broken_links(path: Path) -> list[str]:
    """The relative links of one page that reach no file, or no heading of the page named."""
    broken = []
    for target in link_targets(path):
        parts = urlsplit(target)
        if parts.scheme or parts.netloc:
            continue  # another site: not checked here
        where = (path.parent / unquote(parts.path)).resolve() if parts.path else path
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif (
            parts.fragment
            and where.suffix == ".md"
            and unquote(parts.fragment) not in anchors(where)
        ):
            broken.append(f"{target}: no such heading in {where.name}")
    return broken


@pytest.mark.parametrize("page", documents(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_readme_is_a_front_door() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines"


def test_a_broken_link_is_reported_and_a_good_one_is_not(tmp_path: Path) -> None:
    """Positive control: the checker sees what it is there to see."""
    (tmp_path / "other.md").write_text("# Other page\n\n## The `make run` target: why?\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## Title\n\n"
        "[good](other.md) [good](other.md#the-make-run-target-why) [good](#title-1)\n"
        "[bad](missing.md) [bad](other.md#no-such-heading) [bad](#title-2)\n"
        "![bad](missing.png) [elsewhere](https://example.com/x.md#y)\n\n"
        "```\n[in code](missing-too.md)\n```\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#no-such-heading: no such heading in other.md",
        "#title-2: no such heading in page.md",
        "missing.png: no such file",
    ]
