"""Console roles, as Django groups: viewers see everything; operators (and superusers) act."""

from typing import Any

VIEWERS = "txhub-viewers"
OPERATORS = "txhub-operators"


def can_view(user: Any) -> bool:
    if not user.is_authenticated:
        return False
    return bool(user.is_superuser or user.groups.filter(name__in=[VIEWERS, OPERATORS]).exists())


def can_act(user: Any) -> bool:
    if not user.is_authenticated:
        return False
    return bool(user.is_superuser or user.groups.filter(name=OPERATORS).exists())
