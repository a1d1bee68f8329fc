"""Console roles, as Django groups: viewers see everything; operators (and superusers) act."""

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest

VIEWERS = "txhub-viewers"
OPERATORS = "txhub-operators"


def _roles(user: Any) -> frozenset[str]:
    """The user's txhub groups, read once per user object: one query per request, however many
    checks the view, the navigation and the page make."""
    roles: frozenset[str] | None = getattr(user, "_txhub_roles", None)
    if roles is None:
        names = user.groups.filter(name__in=[VIEWERS, OPERATORS]).values_list("name", flat=True)
        roles = user._txhub_roles = frozenset(names)
    return roles


def can_view(user: Any) -> bool:
    if not user.is_authenticated:
        return False
    return bool(user.is_superuser or _roles(user))


def can_act(user: Any) -> bool:
    if not user.is_authenticated:
        return False
    return bool(user.is_superuser or OPERATORS in _roles(user))


def navigation(request: HttpRequest) -> dict[str, Callable[[], bool]]:
    """Template context: `can_view_here` and `can_act_here`, asked (and read) only by a page that
    shows the navigation: its pages to a viewer, its Audit to an operator, none to a user in no
    txhub group (docs/decisions/0114)."""
    return {
        "can_view_here": lambda: can_view(request.user),
        "can_act_here": lambda: can_act(request.user),
    }
