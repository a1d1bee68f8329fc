"""`visible`: a tenant's string with its invisible characters named (docs/decisions/0092).

A key, a client id or a token name may hold bidirectional controls, which reorder the text
around them on the page ("invoice", U+202E, "fdp.exe" reads "invoiceexe.pdf"), or zero-width
characters, which make two different names look the same. Shown through this filter, each is
replaced by its code point in brackets, e.g. `[U+202E]`; everything else is left to the
template's escaping."""

import re
from typing import Any

from django import template

register = template.Library()

# Arabic letter mark, zero-width space/non-joiner/joiner, LRM/RLM, the embeddings and overrides,
# word joiner and invisible operators, the isolates, and the zero-width no-break space (BOM).
INVISIBLE_RE = re.compile("[\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


def _named(match: re.Match[str]) -> str:
    return f"[U+{ord(match.group()):04X}]"


@register.filter(is_safe=True)
def visible(value: Any) -> str:
    """is_safe: the replacement adds no markup, so a string escaped before (`join`'s) stays safe
    and an unescaped one is still escaped by the template."""
    return INVISIBLE_RE.sub(_named, str(value))
