"""Every limit the doors enforce (CONTRACT section 3; RocketMQ's own), defined once: the numbers,
the patterns the OpenAPI schema states, and pure functions that check them. The REST serializers,
the lean door (through them), the gRPC door and the console all read them from here, so every
limit is checked before anything is stored and the schema says what is checked
(docs/decisions/0045)."""

import re
from typing import TypeVar
from urllib.parse import urlsplit

from django.conf import settings

T = TypeVar("T")

# Patterns are matched whole (re.fullmatch): `^...$` would let "orders\n" through.
NAME_PATTERN = r"[A-Za-z0-9_-]{1,127}"
NAME_RE = re.compile(NAME_PATTERN)
# A message id: txhub makes 32 upper-case hex characters (models.new_msg_id), RocketMQ clients 34
# ("01" + 32 hex) through the gRPC door; any ASCII letters and digits that fit the column are
# looked up (and not found), anything else is not a URL.
MSG_ID_PATTERN = r"[0-9A-Za-z]{1,64}"
MSG_ID_RE = re.compile(MSG_ID_PATTERN)
# A row id in a URL: at most 18 digits, so it always fits Postgres bigint (2^63 - 1).
ROW_ID_PATTERN = r"[0-9]{1,18}"
RESERVED_PREFIXES = ("rmq_sys_", "txhub_")
MAX_NAME_CHARS = 127
MAX_TAG_CHARS = 128
MAX_MESSAGE_GROUP_CHARS = 128
# An operator's or producer's reason for a resolution, kept in the op record.
MAX_REASON_CHARS = 2000
# A token's name and scopes.
MAX_SCOPES = 100
# A producer group's check URL (the column's width).
MAX_URL_CHARS = 2048
# Topics and groups.
MIN_QUEUES, MAX_QUEUES, DEFAULT_QUEUES = 1, 256, 4
MIN_DELIVERY_ATTEMPTS, MAX_DELIVERY_ATTEMPTS, DEFAULT_DELIVERY_ATTEMPTS = 1, 1000, 16
MAX_BOUND_TOPICS = 1000
# A message's check immunity: at most 72 h, RocketMQ's fileReservedTime.
MAX_CHECK_IMMUNITY_SECONDS = 259200
# Messages (or transactions) in one batch, over REST and gRPC alike.
MAX_BATCH_MESSAGES = 64
# Receive: messages per call, invisible time and (REST) long-poll wait, in seconds.
MAX_RECEIVE_MESSAGES, DEFAULT_RECEIVE_MESSAGES = 32, 16
MIN_INVISIBLE_SECONDS, MAX_INVISIBLE_SECONDS, DEFAULT_INVISIBLE_SECONDS = 10, 43200, 60
MAX_WAIT_SECONDS = 20
MAX_TAG_EXPRESSION_CHARS = 4096
# Ack: receipt handles per call, and the longest handle looked at.
MAX_ACK_HANDLES = 1000
MAX_RECEIPT_HANDLE_CHARS = 200
# Pages of a list.
MAX_PAGE_SIZE, DEFAULT_PAGE_SIZE = 500, 50

# The largest integer any API or console field takes: fits integer columns, timedelta and
# Postgres bigint arithmetic (68 years in seconds), so no number can overflow downstream.
MAX_INT = 2**31 - 1
# Characters Postgres text/jsonb cannot hold (NUL) or psycopg cannot encode (a lone surrogate,
# which JSON's "\ud800" escape decodes to): refused in every string that reaches the database.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

# Patterns the OpenAPI schema states (JSON Schema's ECMA-262 regexes, which Python's `re` reads
# the same way; anchored, as JSON Schema does not anchor). Whitespace is spelled out as the
# characters str.isspace() and str.strip() take, not `\s`, whose meaning differs between the two.
WHITESPACE = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# Any string: no NUL (check_text; lone surrogates cannot be written in a regex, JSON Schema or not).
TEXT_SCHEMA_PATTERN = r"^[^\u0000]*$"
# A token's name (check_token_name): no whitespace at either end, so never blank (decision 0114).
TOKEN_NAME_SCHEMA_PATTERN = rf"^[^\u0000{WHITESPACE}](?:[^\u0000]*[^\u0000{WHITESPACE}])?$"
# A key: not blank.
KEY_SCHEMA_PATTERN = rf"^[^\u0000]*[^\u0000{WHITESPACE}][^\u0000]*$"
# A tag (check_tag): not blank, no '|' (its length: MAX_TAG_CHARS).
TAG_SCHEMA_PATTERN = rf"^[^|\u0000]*[^|\u0000{WHITESPACE}][^|\u0000]*$"
_TAG_CHAR = rf"[^|\u0000{WHITESPACE}]"
_TAG_IN_EXPRESSION = rf"{_TAG_CHAR}(?:[^|\u0000]{{0,{MAX_TAG_CHARS - 2}}}{_TAG_CHAR})?"
# A tag expression (parse_tag_expression): blank, `*`, or tags separated by `||`.
TAG_EXPRESSION_SCHEMA_PATTERN = (
    rf"^[{WHITESPACE}]*(?:{_TAG_IN_EXPRESSION}[{WHITESPACE}]*"
    rf"(?:\|\|[{WHITESPACE}]*{_TAG_IN_EXPRESSION}[{WHITESPACE}]*)*)?$"
)
# A name (check_name) that does not start with a reserved prefix, in any case.
RESERVED_SCHEMA_PATTERN = r"^(?:[Rr][Mm][Qq]_[Ss][Yy][Ss]_|[Tt][Xx][Hh][Uu][Bb]_)"
# A message group (check_message_group): no control characters (C0, DEL, C1), not blank; its
# length: MAX_MESSAGE_GROUP_CHARS (docs/decisions/0054).
_CONTROL = r"\u0000-\u001f\u007f-\u009f"
MESSAGE_GROUP_SCHEMA_PATTERN = rf"^[^{_CONTROL}]*[^{_CONTROL}{WHITESPACE}][^{_CONTROL}]*$"
MESSAGE_GROUP_RE = re.compile(MESSAGE_GROUP_SCHEMA_PATTERN)
SCOPE_PATTERN = rf"admin|(?:produce|consume):{NAME_PATTERN}"
SCOPE_RE = re.compile(SCOPE_PATTERN)
# Standard base64 with its padding (what base64.b64decode(validate=True) takes), at least 1 byte.
BASE64_SCHEMA_PATTERN = (
    r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$"
)
# An Idempotency-Key: printable ASCII without spaces, like Stripe's.
IDEMPOTENCY_KEY_PATTERN = r"[\x21-\x7e]{1,255}"
IDEMPOTENCY_KEY_RE = re.compile(IDEMPOTENCY_KEY_PATTERN)
# A check URL, as far as a pattern can say it: the schema states this subset of what Django's
# URLValidator and check_url accept (http(s), a DNS name with a letters-only top-level label or
# an IPv4 address, a port 1..65535, any path without whitespace). Whether the host resolves to an
# allowed address is known only when it is looked up (services/callbacks.callback_url_check).
_IPV4_PART = r"(?:0|25[0-5]|2[0-4][0-9]|1[0-9]?[0-9]?|[1-9][0-9]?)"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_PORT = r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
CHECK_URL_SCHEMA_PATTERN = (
    rf"^https?://(?:{_IPV4_PART}(?:\.{_IPV4_PART}){{3}}|localhost|(?:{_LABEL}\.){{1,2}}[A-Za-z]{{2,63}})"
    rf"(?::{_PORT})?(?:[/?#][^\u0000{WHITESPACE}]*)?$"
)

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


MAX_DELAY_LEVEL = len(DELAY_LEVEL_SECONDS)


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
    """A topic's or group's name: called by the registry's writes (docs/decisions/0106) and by
    every door that answers before them (a field, a lookup)."""
    if not NAME_RE.fullmatch(value):
        raise LimitError(f"{what} must match ^[A-Za-z0-9_-]{{1,127}}$.")
    if value.lower().startswith(RESERVED_PREFIXES):
        raise LimitError(f"{what} must not start with a reserved prefix (rmq_sys_, txhub_).")
    return value


def is_allowed_name(value: str) -> bool:
    """Whether check_name takes `value` (a row from before the rule may not; decision 0114)."""
    try:
        check_name(value, what="name")
    except LimitError:
        return False
    return True


def check_token_name(value: str) -> str:
    """A token's name: a label, never in a scope or a route: storable text of 1 to MAX_NAME_CHARS
    characters (0106), no whitespace at either end, refused and never trimmed (decision 0114)."""
    if not 1 <= len(value) <= MAX_NAME_CHARS:
        raise LimitError(f"A token's name has 1 to {MAX_NAME_CHARS} characters.")
    if value != value.strip():
        raise LimitError("A token's name must not be blank or begin or end with whitespace.")
    return check_text(value)


def check_tag(value: str) -> str:
    if not value.strip():
        raise LimitError("A tag must not be blank.")
    if "|" in value:
        raise LimitError("A tag must not contain '|'.")
    if len(value) > MAX_TAG_CHARS:
        raise LimitError(f"A tag has at most {MAX_TAG_CHARS} characters.")
    return value


def check_message_group(value: str) -> str:
    """A message group (FIFO order, docs/decisions/0054): 1-128 printable characters."""
    check_text(value)
    if not 1 <= len(value) <= MAX_MESSAGE_GROUP_CHARS:
        raise LimitError(f"A message group has 1 to {MAX_MESSAGE_GROUP_CHARS} characters.")
    if not MESSAGE_GROUP_RE.fullmatch(value):
        raise LimitError("A message group must not be blank or contain control characters.")
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


def max_keys() -> int:
    """The most keys a message may have: each is at least one byte (check_keys: not blank), so
    more than TXHUB_MAX_META_BYTES of them can never fit; counted before they are read."""
    limit: int = settings.TXHUB_MAX_META_BYTES
    return limit


def check_meta(*, tags: str, keys: list[str], properties: dict[str, str]) -> None:
    """The sizes of keys, tag and properties: counts first, then bytes (their contents:
    check_keys, check_properties)."""
    if len(properties) > settings.TXHUB_MAX_PROPERTIES:
        raise LimitError(
            f"At most {settings.TXHUB_MAX_PROPERTIES} properties are accepted.", field="properties"
        )
    if len(keys) > max_keys():
        raise LimitError(f"At most {max_keys()} keys are accepted.", field="keys")
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


def check_keys(keys: list[str]) -> list[str]:
    """A message's keys: each storable (check_text) and not blank, as RocketMQ's proxy refuses a
    blank key. After check_meta, which bounds how many there are."""
    for key in keys:
        try:
            check_text(key)
        except LimitError as error:
            raise LimitError(f"A key: {error}", field="keys") from None
        if not key.strip():
            raise LimitError("A key must not be blank.", field="keys")
    return keys


def check_properties(properties: dict[str, str]) -> dict[str, str]:
    """A message's properties: every name not empty, names and values storable (check_text).
    After check_meta, which bounds how many there are."""
    for name, value in properties.items():
        try:
            check_text(name)
            check_text(value)
        except LimitError as error:
            raise LimitError(f"A property: {error}", field="properties") from None
        if not name:
            raise LimitError("A property name must not be empty.", field="properties")
    return properties


def check_batch_bytes(total: int) -> int:
    """A batch's bodies add up to at most TXHUB_MAX_BATCH_BYTES (CONTRACT section 6: 4 MiB in
    all), whichever door it came through."""
    limit: int = settings.TXHUB_MAX_BATCH_BYTES
    if total > limit:
        raise LimitError(
            f"The batch's bodies add up to {total} bytes; at most {limit} are accepted in one "
            "batch.",
            too_large=True,
        )
    return total


class MixedBatch(LimitError):
    """A batch whose messages do not belong together; `position` is the first one at fault
    (0-based)."""

    def __init__(self, message: str, *, position: int) -> None:
        super().__init__(message)
        self.position = position


def check_batch_topic(topics: list[str]) -> str:
    """A batch's messages are for one topic, as RocketMQ's proxy refuses a request that mixes
    them (docs/decisions/0076): the topic, or MixedBatch at the first message for another. The
    REST door's batches name their topic once (the URL, the `topic` field), so they hold it by
    their shape."""
    first = topics[0]
    for position, topic in enumerate(topics):
        if topic != first:
            raise MixedBatch(
                f"Its topic is {topic!r}, the first message's {first!r}: a batch's messages "
                "are for one topic.",
                position=position,
            )
    return first


def parse_tag_expression(expression: str) -> frozenset[str] | None:
    """`*` (or blank) matches everything: None. Otherwise `TagA || TagB`: the set of tags."""
    if expression.strip() in {"", "*"}:
        return None
    tags = [part.strip() for part in expression.split("||")]
    for tag in tags:
        check_tag(tag)
    return frozenset(tags)


def check_scope(value: str) -> str:
    if not SCOPE_RE.fullmatch(value):
        raise LimitError("A scope is 'admin', 'produce:<producer group>' or 'consume:<group>'.")
    return value


def check_scopes(values: list[str]) -> list[str]:
    """A token's scopes, at every door that makes one: 1 to MAX_SCOPES, each a scope."""
    if not 1 <= len(values) <= MAX_SCOPES:
        raise LimitError(f"A token has 1 to {MAX_SCOPES} scopes.")
    return [check_scope(value) for value in values]


def check_id_batch(values: list[T]) -> list[T]:
    """The transactions one batch resolves (REST's :commit/:rollback, the console's and the
    admin's bulk actions): 1 to MAX_BATCH_MESSAGES ids, each once, checked before any is."""
    if not 1 <= len(values) <= MAX_BATCH_MESSAGES:
        raise LimitError(f"A batch has 1 to {MAX_BATCH_MESSAGES} transaction ids.")
    if len(set(values)) != len(values):
        raise LimitError("Each transaction id may appear once in a batch.")
    return values


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


def check_msg_id(value: str) -> str:
    """A message id a producer chose (the gRPC door): MSG_ID_PATTERN."""
    if not MSG_ID_RE.fullmatch(value):
        raise LimitError("A message id is 1-64 ASCII letters and digits.")
    return value


def check_count(count: int, *, most: int, what: str) -> int:
    """1..`most` items in one call (a batch, an ack)."""
    if not 1 <= count <= most:
        raise LimitError(f"Send 1 to {most} {what} per request.")
    return count


def check_tag_expression(value: str) -> frozenset[str] | None:
    """A consumer's tag filter, at every door: its length first (a filter of tens of thousands of
    tags would become that many query parameters, past what Postgres takes), then what it
    says (parse_tag_expression)."""
    if len(value) > MAX_TAG_EXPRESSION_CHARS:
        raise LimitError(f"A tag expression has at most {MAX_TAG_EXPRESSION_CHARS} characters.")
    return parse_tag_expression(check_text(value))


def check_receive_count(count: int) -> int:
    """Messages asked for in one receive: 1..MAX_RECEIVE_MESSAGES (CONTRACT section 3), refused
    outside it, never clamped."""
    if not 1 <= count <= MAX_RECEIVE_MESSAGES:
        raise LimitError(f"Receive 1 to {MAX_RECEIVE_MESSAGES} messages per call.")
    return count


# A RocketMQ client (services/clients.py): the widths of its row's columns (models.GrpcClient),
# the client types the protocol names, and at most as many topics as a group may be bound to.
MAX_CLIENT_ID_CHARS = 255
MAX_CLIENT_HOSTNAME_CHARS = 255
MAX_CLIENT_VERSION_CHARS = 64
MAX_CLIENT_LANGUAGE_CHARS = 32
CLIENT_TYPES = frozenset(
    {
        "PRODUCER",
        "PUSH_CONSUMER",
        "SIMPLE_CONSUMER",
        "PULL_CONSUMER",
        "LITE_PUSH_CONSUMER",
        "LITE_SIMPLE_CONSUMER",
    }
)


class MissingValue(LimitError):
    """A value that is required was not given (blank); `field` names it."""


def check_client_id(value: str) -> str:
    """A client id: not blank (a blank one would be one id shared by every client that sends
    none), at most the column's width (never cut: two long ids sharing a prefix would become one
    client), nothing Postgres cannot store."""
    if not value.strip():
        raise MissingValue("A client id (x-mq-client-id) is required.", field="client_id")
    if len(value) > MAX_CLIENT_ID_CHARS:
        raise LimitError(
            f"A client id has at most {MAX_CLIENT_ID_CHARS} characters.", field="client_id"
        )
    try:
        return check_text(value)
    except LimitError as error:
        raise LimitError(str(error), field="client_id") from None


def check_token_clients(live: int) -> None:
    """A token with `live` client ids in use may take one more only below
    TXHUB_GRPC_MAX_CLIENTS_PER_TOKEN (services/clients.py counts them under a lock; decision
    0084); the official clients use one per process."""
    most = settings.TXHUB_GRPC_MAX_CLIENTS_PER_TOKEN
    if live >= most:
        raise LimitError(
            f"This token has {most} client ids in use (TXHUB_GRPC_MAX_CLIENTS_PER_TOKEN): use one "
            "of them; an id not seen for TXHUB_GRPC_CLIENT_FORGET_SECONDS is forgotten.",
            field="client_id",
        )


def check_client_topics(topics: list[str]) -> list[str]:
    """The topics a client says it publishes or subscribes to: how many first, then each name."""
    if len(topics) > MAX_BOUND_TOPICS:
        raise LimitError(f"A client names at most {MAX_BOUND_TOPICS} topics.", field="topics")
    try:
        for topic in topics:
            check_name(topic, what="A topic")
    except LimitError as error:
        raise LimitError(str(error), field="topics") from None
    return topics


def check_client(
    *, client_type: str, topics: list[str], language: str, version: str, hostname: str
) -> None:
    """What a client says about itself (Telemetry settings, heartbeats), before it is stored:
    a known client type, its topics, and texts that fit their columns."""
    if client_type not in CLIENT_TYPES:
        raise LimitError(f"Unknown client type {client_type!r}.", field="client_type")
    check_client_topics(topics)
    check_client_texts(language=language, version=version, hostname=hostname)


def check_client_texts(*, language: str, version: str, hostname: str = "") -> None:
    """A client's language, version and hostname fit their columns and can be stored, whether
    they came in Telemetry settings or in the x-mq-language and x-mq-client-version headers of
    any call (refused there too, never cut: docs/decisions/0076)."""
    bounded = (
        ("language", language, MAX_CLIENT_LANGUAGE_CHARS),
        ("version", version, MAX_CLIENT_VERSION_CHARS),
        ("hostname", hostname, MAX_CLIENT_HOSTNAME_CHARS),
    )
    for field, value, most in bounded:
        if len(value) > most:
            raise LimitError(f"A client's {field} has at most {most} characters.", field=field)
        try:
            check_text(value)
        except LimitError as error:
            raise LimitError(f"A client's {field}: {error}", field=field) from None


# The access point a gRPC client says it dialled: the routes echo it for every queue of a topic,
# so it is bounded here, never copied as sent (docs/decisions/0091).
MAX_ACCESS_POINT_ADDRESSES = 16
MAX_ACCESS_POINT_HOST_CHARS = 255


def check_access_point(addresses: list[tuple[str, int]]) -> None:
    """At most MAX_ACCESS_POINT_ADDRESSES addresses, each a host that is not blank, has at most
    MAX_ACCESS_POINT_HOST_CHARS storable characters, and a port 1..65535."""
    if len(addresses) > MAX_ACCESS_POINT_ADDRESSES:
        raise LimitError(f"An access point has at most {MAX_ACCESS_POINT_ADDRESSES} addresses.")
    for host, port in addresses:
        if not host.strip() or len(host) > MAX_ACCESS_POINT_HOST_CHARS:
            raise LimitError(f"A host has 1 to {MAX_ACCESS_POINT_HOST_CHARS} characters.")
        check_text(host)
        if not 1 <= port <= 65535:
            raise LimitError("A port is 1..65535.")
