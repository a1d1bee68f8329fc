"""The Django admin's site, and what its pages show of an object's name: the name of every object
(`str(obj)`) and every log entry's text an admin page shows goes through the function the
console's `visible` filter calls, so a bidirectional control or zero-width character in it is
shown by its code point, e.g. `[U+202E]` (docs/decisions/0092, 0103)."""

from collections.abc import Iterator
from typing import Any

from django.contrib.admin.models import LogEntry
from django.contrib.admin.sites import AdminSite
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeData, mark_safe

from apps.console.invisible import name_invisible


def named(value: Any) -> Any:
    """`value`, a text or a nested list of texts (the objects a deletion takes), with its invisible
    characters named. A text Django made safe (a link to an object) stays safe: naming adds no
    markup, and the characters it replaces are none of HTML's."""
    if isinstance(value, list | tuple):
        return [named(item) for item in value]
    text = name_invisible(str(value))
    return mark_safe(text) if isinstance(value, SafeData) else text  # noqa: S308


class ShownObject:
    """An object as an admin page shows it: its name with its invisible characters named; all
    else a page asks of it (its pk, for a link) is the object's own."""

    def __init__(self, shown: Any) -> None:
        self._shown = shown

    def __str__(self) -> str:
        return name_invisible(str(self._shown))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._shown, name)


class ShownLogEntry(ShownObject):
    """A log entry as the history page and the recent actions show it: the name of its object
    and its change message named."""

    @property
    def object_repr(self) -> str:
        return name_invisible(self._shown.object_repr)

    def get_change_message(self) -> str:
        return name_invisible(self._shown.get_change_message())


class ShownLogEntries(QuerySet[LogEntry]):
    """Log entries that are read as ShownLogEntry; filtering and slicing keep them so."""

    def __iter__(self) -> Iterator[Any]:
        return (ShownLogEntry(entry) for entry in super().__iter__())


class TxhubAdminSite(AdminSite):
    """Django's admin site, its recent actions (the index's sidebar) read as ShownLogEntry."""

    def get_log_entries(self, request: HttpRequest) -> QuerySet[LogEntry]:
        entries = super().get_log_entries(request)
        return ShownLogEntries(model=LogEntry, query=entries.query, using=entries.db)
