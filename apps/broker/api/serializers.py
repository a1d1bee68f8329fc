"""Input serializers (validation against the contract's limits) and output serializers.

Inputs are strict: wrong JSON types and unknown fields are refused, never coerced or ignored.
"""

import base64
import binascii
from dataclasses import replace
from datetime import UTC, datetime
from itertools import islice
from typing import Any

from django.conf import settings
from django.core.validators import URLValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.broker import limits
from apps.broker.api.parsers import PayloadTooLarge
from apps.broker.models import ConsumeFrom, TransactionState
from apps.broker.services.registry import MAX_BOUND_TOPICS
from apps.broker.services.sending import OutgoingMessage


def _strict_text(value: str) -> str:
    try:
        return limits.check_text(value)
    except limits.LimitError as error:
        raise serializers.ValidationError(str(error)) from None


class StrictCharField(serializers.CharField):
    """A JSON string only (DRF's CharField would turn 12 into "12"); never a character Postgres
    cannot store (NUL, a lone surrogate): limits.check_text, the one check for every string."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(_strict_text(data)))


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer only: no "4", no 4.5, no true; never above limits.MAX_INT."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_value", limits.MAX_INT)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return int(super().to_internal_value(data))


class StrictListField(serializers.ListField):
    """A JSON list, its length checked before any element (OWASP API4: a 1,000,000-element list
    costs nothing to refuse), and refused at its first bad element (DRF's ListField validates
    every element and reports each one)."""

    def __init__(self, *, max_length: int, **kwargs: Any) -> None:
        super().__init__(max_length=max_length, **kwargs)

    def to_internal_value(self, data: Any) -> list[Any]:
        if not isinstance(data, list):
            self.fail("not_a_list", input_type=type(data).__name__)
        if not self.allow_empty and not data:
            self.fail("empty")
        if self.max_length is not None and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        result = []
        for index, item in enumerate(data):
            try:
                result.append(self.child.run_validation(item))
            except serializers.ValidationError as error:
                raise serializers.ValidationError({str(index): error.detail}) from None
        return result


class StrictDictField(serializers.DictField):
    """A JSON object of strings: its size checked first, every key through the same string check
    as every value (DRF's DictField checks values only), refused at the first bad entry."""

    def __init__(self, *, max_size: int, **kwargs: Any) -> None:
        self.max_size = max_size
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            self.fail("not_a_dict", input_type=type(data).__name__)
        if len(data) > self.max_size:
            raise serializers.ValidationError(f"At most {self.max_size} entries are accepted.")
        result = {}
        for key, value in data.items():
            try:
                limits.check_text(key)
            except limits.LimitError as error:
                raise serializers.ValidationError(f"A name: {error}") from None
            try:
                result[key] = self.child.run_validation(value)
            except serializers.ValidationError as error:
                raise serializers.ValidationError({key: error.detail}) from None
        return result


class UrlField(StrictCharField):
    """A URL txhub can call: Django's URLValidator and limits.check_url (port, host)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=2048, **kwargs)
        self.validators.append(URLValidator(schemes=["http", "https"]))

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        try:
            return limits.check_url(value)
        except limits.LimitError as error:
            raise serializers.ValidationError(str(error)) from None


class StrictSerializer(serializers.Serializer[Any]):
    """Refuses fields it does not know, so a typo ("tag", "delay_levle") is an error. A few
    unknown names are named; a body of 250,000 of them does not become a 12 MB answer."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = set(data) - set(self.fields)
            if unknown:
                named = sorted(islice(unknown, 10))
                raise serializers.ValidationError(
                    {name: ["This field is not part of the API."] for name in named}
                )
        return super().to_internal_value(data)


@extend_schema_field(
    {"type": "string", "pattern": f"^{limits.NAME_PATTERN}$", "minLength": 1, "maxLength": 127}
)
class NameField(StrictCharField):
    def __init__(self, what: str, **kwargs: Any) -> None:
        self.what = what
        super().__init__(trim_whitespace=False, **kwargs)

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        try:
            return limits.check_name(value, what=self.what)
        except limits.LimitError as error:
            raise serializers.ValidationError(str(error)) from None


def _text(**kwargs: Any) -> StrictCharField:
    return StrictCharField(trim_whitespace=False, **kwargs)


class MessageIn(StrictSerializer):
    producer_group = NameField("producer_group")
    body = _text(required=False, allow_blank=True)
    body_base64 = _text(required=False, allow_blank=True)
    tags = _text(required=False, allow_null=True, allow_blank=True)
    # Field-level caps: what could ever fit in TXHUB_MAX_META_BYTES (each entry takes at least
    # one byte); the contract's own limits (128 properties, 16 KiB) are checked in validate().
    keys = StrictListField(child=_text(), required=False, max_length=settings.TXHUB_MAX_META_BYTES)
    properties = StrictDictField(
        child=_text(allow_blank=True), required=False, max_size=settings.TXHUB_MAX_META_BYTES
    )
    delay_level = StrictIntegerField(required=False, min_value=1, max_value=18)
    deliver_at = _text(required=False)

    def validate_deliver_at(self, value: str) -> datetime:
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise serializers.ValidationError(
                "Use ISO-8601, e.g. 2026-01-31T12:00:00+00:00."
            ) from None
        if parsed.tzinfo is None:
            raise serializers.ValidationError("The time needs a UTC offset, e.g. +00:00 or Z.")
        try:
            # Stored in UTC: an offset near year 1 or 9999 can make a row psycopg cannot read.
            return parsed.astimezone(UTC)
        except OverflowError:
            raise serializers.ValidationError("The time is out of range.") from None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("body" in attrs) == ("body_base64" in attrs):
            raise serializers.ValidationError(
                {"body": ["Send exactly one of 'body' (UTF-8 text) and 'body_base64' (bytes)."]}
            )
        if "delay_level" in attrs and "deliver_at" in attrs:
            raise serializers.ValidationError(
                {"delay_level": ["Send at most one of 'delay_level' and 'deliver_at'."]}
            )
        body = _decode_body(attrs)
        try:
            limits.check_body_size(body)
        except limits.LimitError as error:
            if error.too_large:
                raise PayloadTooLarge(str(error)) from None
            raise serializers.ValidationError({"body": [str(error)]}) from None
        tags = attrs.get("tags") or ""
        try:
            if attrs.get("tags") is not None:
                limits.check_tag(tags)
            limits.check_meta(
                tags=tags, keys=attrs.get("keys", []), properties=attrs.get("properties", {})
            )
        except limits.LimitError as error:
            raise serializers.ValidationError({error.field or "tags": [str(error)]}) from None
        if any(not key.strip() for key in attrs.get("keys", [])):
            raise serializers.ValidationError({"keys": ["A key must not be blank."]})
        if any(not name for name in attrs.get("properties", {})):
            raise serializers.ValidationError(
                {"properties": ["A property name must not be empty."]}
            )
        attrs["message"] = OutgoingMessage(
            producer_group=attrs["producer_group"],
            body=body,
            body_is_binary="body_base64" in attrs,
            tags=tags,
            keys=attrs.get("keys", []),
            properties=attrs.get("properties", {}),
        )
        return attrs


def _decode_body(attrs: dict[str, Any]) -> bytes:
    if "body" in attrs:
        try:
            return bytes(attrs["body"].encode("utf-8"))
        except UnicodeEncodeError:
            raise serializers.ValidationError(
                {"body": ["The body is not valid UTF-8 text."]}
            ) from None
    try:
        return base64.b64decode(attrs["body_base64"], validate=True)
    except (binascii.Error, ValueError):
        raise serializers.ValidationError({"body_base64": ["This is not valid base64."]}) from None


class TransactionIn(MessageIn):
    topic = NameField("topic")
    check_immunity_seconds = StrictIntegerField(required=False, min_value=0, max_value=259200)


# Batches (CONTRACT: batch endpoints) ------------------------------------------------------------

MAX_BATCH_MESSAGES = 64


class BatchMessageIn(MessageIn):
    """One message of a batch send: the batch names the producer group once."""

    producer_group = None  # type: ignore[assignment]  # removes MessageIn's field

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return super().validate({**attrs, "producer_group": ""})  # set by the batch


class BatchTransactionIn(BatchMessageIn):
    """One half message of a batch prepare: the batch names the group and the topic once."""

    check_immunity_seconds = StrictIntegerField(required=False, min_value=0, max_value=259200)


class StrictUUIDField(serializers.UUIDField):
    """A UUID written as a JSON string (DRF's UUIDField would also take an integer)."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid", value="(not a string)")
        return super().to_internal_value(_strict_text(data))


def _batch_size_checked(attrs: dict[str, Any]) -> dict[str, Any]:
    """The batch's bodies within TXHUB_MAX_BATCH_BYTES, each message given the batch's group."""
    total = sum(len(item["message"].body) for item in attrs["messages"])
    if total > settings.TXHUB_MAX_BATCH_BYTES:
        raise PayloadTooLarge(
            f"The batch's bodies add up to {total} bytes; at most "
            f"{settings.TXHUB_MAX_BATCH_BYTES} are accepted in one batch."
        )
    group = attrs["producer_group"]
    for item in attrs["messages"]:
        item["message"] = replace(item["message"], producer_group=group)
        item["producer_group"] = group
    return attrs


class SendBatchIn(StrictSerializer):
    producer_group = NameField("producer_group")
    messages = StrictListField(
        child=BatchMessageIn(), max_length=MAX_BATCH_MESSAGES, allow_empty=False
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return _batch_size_checked(attrs)


class PrepareBatchIn(StrictSerializer):
    producer_group = NameField("producer_group")
    topic = NameField("topic")
    messages = StrictListField(
        child=BatchTransactionIn(), max_length=MAX_BATCH_MESSAGES, allow_empty=False
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return _batch_size_checked(attrs)


class ResolveBatchIn(StrictSerializer):
    transaction_ids = StrictListField(
        child=StrictUUIDField(), max_length=MAX_BATCH_MESSAGES, allow_empty=False
    )
    reason = _text(required=False, allow_blank=True, max_length=limits.MAX_REASON_CHARS)

    def validate_transaction_ids(self, value: list[Any]) -> list[Any]:
        if len(set(value)) != len(value):
            raise serializers.ValidationError("Each transaction id may appear once in a batch.")
        return value


class ReasonIn(StrictSerializer):
    reason = _text(required=False, allow_blank=True, max_length=limits.MAX_REASON_CHARS)


class TopicIn(StrictSerializer):
    name = NameField("name")
    queues = StrictIntegerField(required=False, default=4, min_value=1, max_value=256)


class ProducerGroupIn(StrictSerializer):
    name = NameField("name")
    # Optional: a group whose producers are RocketMQ clients is checked over their stream.
    check_url = UrlField(required=False)


class ProducerGroupPatchIn(StrictSerializer):
    check_url = UrlField()


class ConsumerGroupIn(StrictSerializer):
    name = NameField("name")
    max_delivery_attempts = StrictIntegerField(
        required=False, default=16, min_value=1, max_value=1000
    )
    consume_from = serializers.ChoiceField(
        choices=ConsumeFrom.choices, required=False, default=ConsumeFrom.FIRST
    )


class TopicBindingsIn(StrictSerializer):
    """PUT .../topics: the whole list of topics a group may use; [] unbinds (any topic)."""

    MAX_TOPICS = MAX_BOUND_TOPICS
    topics = serializers.ListField(child=NameField("topic"), max_length=MAX_TOPICS)

    def to_internal_value(self, data: Any) -> Any:
        # Size before contents: a huge list is refused without looking at its elements.
        topics = data.get("topics") if isinstance(data, dict) else None
        if isinstance(topics, list) and len(topics) > self.MAX_TOPICS:
            raise serializers.ValidationError(
                {"topics": [f"At most {self.MAX_TOPICS} topics can be bound to a group."]}
            )
        return super().to_internal_value(data)


class TokenIn(StrictSerializer):
    name = _text(max_length=127)
    scopes = StrictListField(child=_text(), allow_empty=False, max_length=100)

    def validate_scopes(self, value: list[str]) -> list[str]:
        try:
            return [limits.check_scope(scope) for scope in value]
        except limits.LimitError as error:
            raise serializers.ValidationError(str(error)) from None


class ReceiveIn(StrictSerializer):
    topic = NameField("topic")
    max_messages = StrictIntegerField(required=False, default=16, min_value=1, max_value=32)
    invisible_seconds = StrictIntegerField(
        required=False, default=60, min_value=10, max_value=43200
    )
    wait_seconds = StrictIntegerField(required=False, default=0, min_value=0, max_value=20)
    tag_expression = _text(required=False, default="*", max_length=4096)

    def validate_tag_expression(self, value: str) -> frozenset[str] | None:
        try:
            return limits.parse_tag_expression(value)
        except limits.LimitError as error:
            raise serializers.ValidationError(str(error)) from None


class AckIn(StrictSerializer):
    receipt_handles = StrictListField(
        child=_text(max_length=200), allow_empty=False, max_length=1000
    )


class ChangeInvisibleIn(StrictSerializer):
    receipt_handle = _text(max_length=200)
    invisible_seconds = StrictIntegerField(min_value=10, max_value=43200)


class QueryIntegerField(serializers.IntegerField):
    """A query-string integer: ASCII digits only (int() also takes "１" and "1_000"), at most
    limits.MAX_INT, so a 20-digit value is a 400 and not an overflow in a query."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_value", limits.MAX_INT)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        if not isinstance(data, str) or not data.isascii() or not data.isdigit():
            self.fail("invalid")
        if len(data) > 12:
            self.fail("max_value", max_value=self.max_value)
        return int(super().to_internal_value(data))


class PageIn(StrictSerializer):
    page = QueryIntegerField(required=False, min_value=1)
    page_size = QueryIntegerField(required=False, min_value=1, max_value=500)


class TransactionListIn(StrictSerializer):
    producer_group = NameField("producer_group", required=False)
    state = serializers.ChoiceField(choices=TransactionState.choices, required=False)
    older_than_seconds = QueryIntegerField(required=False, min_value=0)
    page = QueryIntegerField(required=False, min_value=1)
    page_size = QueryIntegerField(required=False, min_value=1, max_value=500)
