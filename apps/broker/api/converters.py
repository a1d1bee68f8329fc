"""Path converters for every name and id in a URL (API and console), registered once.

A segment that does not have the shape of a name or id (a NUL byte, a lone surrogate, a newline,
an overlong value, an id beyond bigint) does not match the URL at all: a 404 in the contract's
format, before any view or query runs."""

from django.urls import register_converter

from apps.broker import limits


class NameConverter:
    regex = limits.NAME_PATTERN

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class MsgIdConverter(NameConverter):
    regex = limits.MSG_ID_PATTERN


class RowIdConverter:
    regex = limits.ROW_ID_PATTERN

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(NameConverter, "name")
register_converter(MsgIdConverter, "msgid")
register_converter(RowIdConverter, "rowid")
