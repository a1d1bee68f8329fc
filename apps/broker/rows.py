"""Model instances from plain SQL, for the hot paths (issue 10: the ORM's query compilation cost
~0.3 ms of CPU per query here, a plain statement ~0.04 ms; `bench/README.md`, profiling).

`columns(Model, alias)` is the select list of every concrete column, `load(Model, row, start)`
builds the instance from that slice of a row, applying each field's converters as the ORM does
(a JSONField's text to Python, say), so what comes back is the same object a queryset returns.
"""

from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, TypeVar

from django.db import connection, models
from django.db.models.expressions import Col

M = TypeVar("M", bound=models.Model)


@cache
def _fields(model: type[models.Model]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    fields = model._meta.concrete_fields
    return tuple(str(f.column) for f in fields), tuple(f.attname for f in fields)


@cache
def _converters(
    model: type[models.Model],
) -> tuple[tuple[int, Col, tuple[Callable[..., Any], ...]], ...]:
    found = []
    for index, field in enumerate(model._meta.concrete_fields):
        col = Col(model._meta.db_table, field)
        chain = tuple(connection.ops.get_db_converters(col)) + tuple(
            field.get_db_converters(connection)
        )
        if chain:
            found.append((index, col, chain))
    return tuple(found)


def columns(model: type[models.Model], alias: str) -> str:
    """`alias.col1, alias.col2, ...`: every concrete column, in `load`'s order."""
    names, _ = _fields(model)
    return ", ".join(f'{alias}."{name}"' for name in names)


def width(model: type[models.Model]) -> int:
    return len(_fields(model)[0])


def load(model: type[M], row: Sequence[Any], start: int = 0) -> M:
    names, attnames = _fields(model)
    values = list(row[start : start + len(names)])
    for index, col, chain in _converters(model):
        for convert in chain:
            values[index] = convert(values[index], col, connection)
    return model.from_db(connection.alias, list(attnames), values)


def one_by(model: type[M], column: str, value: Any) -> M | None:
    """The row whose `column` equals `value`, or None (a unique column)."""
    table = model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT {columns(model, "t")} FROM "{table}" t WHERE t."{column}" = %s',  # noqa: S608
            [value],
        )
        row = cursor.fetchone()
    return None if row is None else load(model, row)
