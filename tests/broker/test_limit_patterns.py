"""The patterns the OpenAPI schema states (apps/broker/limits.py) take exactly what the checks
take (docs/decisions/0045): a client that follows the schema is never refused for the shape of a
string, and the schema never forbids what the API takes."""

import base64
import binascii
import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from apps.broker import limits

# Characters where the rules differ: separators, whitespace of every kind, NUL, letters.
TRICKY = st.sampled_from(list("|*aZ09_-: \t\n\x0b\x1c\x85\xa0\u2000\u3000\x00") + ["||"])
TEXT = st.lists(TRICKY | st.characters(codec="utf-8"), max_size=140).map("".join)


def _takes(check: object, value: str) -> bool:
    try:
        check(value)  # type: ignore[operator]
    except limits.LimitError:
        return False
    return True


def _matches(pattern: str, value: str) -> bool:
    return re.fullmatch(pattern, value) is not None


@settings(max_examples=400, database=None)
@given(TEXT)
@example("a" * 128)
@example("a" * 129)
@example(" \x1c ")
def test_the_tag_pattern_takes_what_check_tag_takes(value: str) -> None:
    stated = _matches(limits.TAG_SCHEMA_PATTERN, value) and len(value) <= limits.MAX_TAG_CHARS
    checked = _takes(limits.check_text, value) and _takes(limits.check_tag, value)
    assert stated == checked


@settings(max_examples=400, database=None)
@given(st.lists(TEXT.filter(lambda t: len(t) < 40), max_size=4).map("||".join) | TEXT)
@example(" a || " + "b" * 128 + " ")
@example("a||" + "b" * 129)
@example("a|||b")
def test_the_tag_expression_pattern_takes_what_the_parser_takes(value: str) -> None:
    stated = _matches(limits.TAG_EXPRESSION_SCHEMA_PATTERN, value)
    checked = _takes(limits.check_text, value) and _takes(limits.parse_tag_expression, value)
    assert stated == checked


@settings(max_examples=300, database=None)
@given(TEXT | st.from_regex(limits.SCOPE_PATTERN, fullmatch=True))
@example("admin")
@example("produce:" + "a" * 128)
def test_the_scope_pattern_takes_what_check_scope_takes(value: str) -> None:
    stated = _matches(f"^(?:{limits.SCOPE_PATTERN})$", value)
    assert stated == _takes(limits.check_scope, value)


@settings(max_examples=300, database=None)
@given(TEXT | st.binary(max_size=20).map(lambda b: base64.b64encode(b).decode()))
@example("AB==")
@example("A===")
def test_the_base64_pattern_takes_what_decodes_to_a_body(value: str) -> None:
    try:
        decoded = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        decoded = b""
    assert _matches(limits.BASE64_SCHEMA_PATTERN, value) == (len(decoded) >= 1)


@settings(max_examples=300, database=None)
@given(TEXT)
def test_the_key_pattern_takes_non_blank_storable_text(value: str) -> None:
    checked = _takes(limits.check_text, value) and bool(value.strip())
    assert _matches(limits.KEY_SCHEMA_PATTERN, value) == checked


@settings(max_examples=400, database=None)
@given(TEXT)
@example(" ")
@example("ops deploy")
@example("a" * 127)
@example("a" * 128)
def test_the_token_name_pattern_takes_what_check_token_name_takes(value: str) -> None:
    """Whitespace at either end is refused, never trimmed (docs/decisions/0114)."""
    stated = (
        _matches(limits.TOKEN_NAME_SCHEMA_PATTERN, value) and len(value) <= limits.MAX_NAME_CHARS
    )
    assert stated == _takes(limits.check_token_name, value)
