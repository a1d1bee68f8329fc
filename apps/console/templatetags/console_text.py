"""`visible`: a tenant's string with its invisible characters named (docs/decisions/0092), by the
one function the Django admin calls too (apps/console/invisible.py); everything else is left to
the template's escaping."""

from typing import Any

from django import template

from apps.console.invisible import name_invisible

register = template.Library()


@register.filter(is_safe=True)
def visible(value: Any) -> str:
    """is_safe: the replacement adds no markup, so a string escaped before (`join`'s) stays safe
    and an unescaped one is still escaped by the template."""
    return name_invisible(str(value))
