"""RocketMQ's message limits (CONTRACT section 3), as pure functions used by the API's input
serializers, so every limit is checked before anything is stored."""

import re

from django.conf import settings

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,127}$")
RESERVED_PREFIXES = ("rmq_sys_", "txhub_")
MAX_TAG_CHARS = 128

# RocketMQ's messageDelayLevel, in seconds: 1s 5s 10s 30s 1m 2m ... 10m 20m 30m 1h 2h.
DELAY_LEVEL_SECONDS = (
    1,
    5,
    10,
    30,
    60,
    120,
    180,
    240,
    300,
    360,
    420,
    480,
    540,
    600,
    1200,
    1800,
    3600,
    7200,
)


class LimitError(ValueError):
    """A value breaks a contract limit; `too_large` marks the 413 case."""

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


def check_name(value: str, *, what: str) -> str:
    if not NAME_RE.match(value):
        raise LimitError(f"{what} must match ^[A-Za-z0-9_-]{{1,127}}$.")
    if value.lower().startswith(RESERVED_PREFIXES):
        raise LimitError(f"{what} must not start with a reserved prefix (rmq_sys_, txhub_).")
    return value


def check_tag(value: str) -> str:
    if not value.strip():
        raise LimitError("A tag must not be blank.")
    if "|" in value:
        raise LimitError("A tag must not contain '|'.")
    if len(value) > MAX_TAG_CHARS:
        raise LimitError(f"A tag has at most {MAX_TAG_CHARS} characters.")
    return value


def check_body_size(body: bytes) -> bytes:
    if len(body) < 1:
        raise LimitError("The body must have at least 1 byte.")
    limit: int = settings.TXHUB_MAX_BODY_BYTES
    if len(body) > limit:
        raise LimitError(
            f"The body is {len(body)} bytes; at most {limit} are accepted.", too_large=True
        )
    return body


def check_meta(*, tags: str, keys: list[str], properties: dict[str, str]) -> None:
    if len(properties) > settings.TXHUB_MAX_PROPERTIES:
        raise LimitError(f"At most {settings.TXHUB_MAX_PROPERTIES} properties are accepted.")
    size = len(tags.encode()) + sum(len(k.encode()) for k in keys)
    size += sum(len(k.encode()) + len(v.encode()) for k, v in properties.items())
    if size > settings.TXHUB_MAX_META_BYTES:
        raise LimitError(
            f"Keys, tags and properties take {size} bytes; at most "
            f"{settings.TXHUB_MAX_META_BYTES} are accepted."
        )


def parse_tag_expression(expression: str) -> frozenset[str] | None:
    """`*` (or blank) matches everything: None. Otherwise `TagA || TagB`: the set of tags."""
    if expression.strip() in {"", "*"}:
        return None
    tags = [part.strip() for part in expression.split("||")]
    for tag in tags:
        check_tag(tag)
    return frozenset(tags)


def check_scope(value: str) -> str:
    if value == "admin":
        return value
    kind, _, group = value.partition(":")
    if kind not in {"produce", "consume"} or not NAME_RE.match(group):
        raise LimitError("A scope is 'admin', 'produce:<producer group>' or 'consume:<group>'.")
    return value
