"""A tenant's string with its invisible characters named (docs/decisions/0092).

A key, a client id or a token name may hold bidirectional controls, which reorder the text
around them on the page ("invoice", U+202E, "fdp.exe" reads "invoiceexe.pdf"), or zero-width
characters, which make two different names look the same. The console's `visible` filter and the
Django admin both show such a string through `name_invisible`: each of those characters replaced
by its code point in brackets, e.g. `[U+202E]`."""

import re

# Arabic letter mark, zero-width space/non-joiner/joiner, LRM/RLM, the embeddings and overrides,
# word joiner and invisible operators, the isolates, and the zero-width no-break space (BOM).
INVISIBLE_RE = re.compile("[\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


def _named(match: re.Match[str]) -> str:
    return f"[U+{ord(match.group()):04X}]"


def name_invisible(text: str) -> str:
    """`text` with each bidirectional control and zero-width character shown as its code point;
    it adds no markup, so escaping before or after it is the same."""
    return INVISIBLE_RE.sub(_named, text)
