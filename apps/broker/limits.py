"""RocketMQ's message limits (CONTRACT section 3), as pure functions used by the API's input
serializers, so every limit is checked before anything is stored."""

import re
from urllib.parse import urlsplit

from django.conf import settings

# Patterns are matched whole (re.fullmatch): `^...$` would let "orders\n" through.
NAME_PATTERN = r"[A-Za-z0-9_-]{1,127}"
NAME_RE = re.compile(NAME_PATTERN)
# A message id: txhub makes 32 upper-case hex characters (models.new_msg_id), RocketMQ clients 34
# ("01" + 32 hex) through the gRPC door; any ASCII letters and digits that fit the column are
# looked up (and not found), anything else is not a URL.
MSG_ID_PATTERN = r"[0-9A-Za-z]{1,64}"
# A row id in a URL: at most 18 digits, so it always fits Postgres bigint (2^63 - 1).
ROW_ID_PATTERN = r"[0-9]{1,18}"
RESERVED_PREFIXES = ("rmq_sys_", "txhub_")
MAX_TAG_CHARS = 128
# An operator's or producer's reason for a resolution, kept in the op record.
MAX_REASON_CHARS = 2000

# The largest integer any API or console field takes: fits integer columns, timedelta and
# Postgres bigint arithmetic (68 years in seconds), so no number can overflow downstream.
MAX_INT = 2**31 - 1
# Characters Postgres text/jsonb cannot hold (NUL) or psycopg cannot encode (a lone surrogate,
# which JSON's "\ud800" escape decodes to): refused in every string that reaches the database.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

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
    """A value breaks a contract limit; `too_large` marks the 413 case; `field` names the input
    at fault when the check looks at several."""

    def __init__(self, message: str, *, too_large: bool = False, field: str = "") -> None:
        super().__init__(message)
        self.too_large = too_large
        self.field = field


def check_text(value: str) -> str:
    """The one check for every string the API takes: nothing Postgres cannot store."""
    if _UNSTORABLE.search(value):
        raise LimitError(
            "NUL characters and lone surrogates (unpaired \\uD800-\\uDFFF) are refused."
        )
    return value


def check_name(value: str, *, what: str) -> str:
    if not NAME_RE.fullmatch(value):
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
        raise LimitError(
            f"At most {settings.TXHUB_MAX_PROPERTIES} properties are accepted.", field="properties"
        )
    keys_size = sum(len(k.encode()) for k in keys)
    properties_size = sum(len(k.encode()) + len(v.encode()) for k, v in properties.items())
    size = len(tags.encode()) + keys_size + properties_size
    if size > settings.TXHUB_MAX_META_BYTES:
        raise LimitError(
            f"Keys, tags and properties take {size} bytes; at most "
            f"{settings.TXHUB_MAX_META_BYTES} are accepted.",
            # The tag is short (check_tag), so keys or properties are what is too large.
            field="properties" if properties_size >= keys_size else "keys",
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
    if kind not in {"produce", "consume"} or not NAME_RE.fullmatch(group):
        raise LimitError("A scope is 'admin', 'produce:<producer group>' or 'consume:<group>'.")
    return value


def check_url(value: str) -> str:
    """A check URL the callback can actually use: http(s), a host that encodes to IDNA, a port
    in 1..65535 (Django's URLValidator lets :99999 through; urllib would fail on it later)."""
    check_text(value)
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        raise LimitError("The check URL is not a valid URL (host or port).") from None
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise LimitError("A check URL must be http(s)://host/...")
    if port == 0:
        raise LimitError("The check URL's port must be 1..65535.")
    try:
        parts.hostname.encode("idna")
    except UnicodeError:
        raise LimitError("The check URL's host name is not a valid domain name.") from None
    return value
