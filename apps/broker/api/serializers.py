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
from rest_framework import serializers

from apps.broker import limits
from apps.broker.api.fields import (
    NameField,
    QueryIntegerField,
    StrictBooleanField,
    StrictCharField,
    StrictDictField,
    StrictIntegerField,
    StrictListField,
    StrictUUIDField,
    UrlField,
)
from apps.broker.api.parsers import PayloadTooLarge
from apps.broker.models import ConsumeFrom, TransactionState
from apps.broker.services.sending import OutgoingMessage


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


def _text(**kwargs: Any) -> StrictCharField:
    return StrictCharField(trim_whitespace=False, **kwargs)


# The schema's bounds of a body: a string of more characters than the body may have bytes is
# always too large (413); the byte count itself is checked in validate() (limits.check_body_size).
_BODY_CHARS = settings.TXHUB_MAX_BODY_BYTES
_BODY_BASE64_CHARS = 4 * -(-settings.TXHUB_MAX_BODY_BYTES // 3)


class MessageIn(StrictSerializer):
    # What validate() checks across fields, stated in the schema: exactly one of the two bodies,
    # at most one of the two delays.
    # A message group is never delayed (services/delivery.delivery_time).
    schema_rules: dict[str, Any] = {
        "oneOf": [{"required": ["body"]}, {"required": ["body_base64"]}],
        "not": {
            "anyOf": [
                {"required": ["delay_level", "deliver_at"]},
                {"required": ["message_group", "delay_level"]},
                {"required": ["message_group", "deliver_at"]},
            ]
        },
    }
    producer_group = NameField("producer_group")
    body = _text(
        required=False, allow_blank=True, schema={"minLength": 1, "maxLength": _BODY_CHARS}
    )
    body_base64 = _text(
        required=False,
        allow_blank=True,
        pattern=limits.BASE64_SCHEMA_PATTERN,
        schema={"maxLength": _BODY_BASE64_CHARS},
    )
    tags = _text(
        required=False,
        allow_null=True,
        allow_blank=True,
        pattern=limits.TAG_SCHEMA_PATTERN,
        schema={"maxLength": limits.MAX_TAG_CHARS},
    )
    # Field-level caps: what could ever fit in TXHUB_MAX_META_BYTES (each entry takes at least
    # one byte); the contract's own limits (128 properties, 16 KiB) are checked in validate().
    keys = StrictListField(
        child=_text(pattern=limits.KEY_SCHEMA_PATTERN),
        required=False,
        max_length=limits.max_keys(),
    )
    properties = StrictDictField(
        child=_text(allow_blank=True),
        required=False,
        max_size=settings.TXHUB_MAX_META_BYTES,
        schema={
            "maxProperties": settings.TXHUB_MAX_PROPERTIES,
            "propertyNames": {"minLength": 1, "pattern": limits.TEXT_SCHEMA_PATTERN},
        },
    )
    delay_level = StrictIntegerField(required=False, min_value=1, max_value=limits.MAX_DELAY_LEVEL)
    deliver_at = _text(required=False, pattern=None, schema={"format": "date-time"})
    message_group = _text(
        required=False,
        pattern=limits.MESSAGE_GROUP_SCHEMA_PATTERN,
        schema={"minLength": 1, "maxLength": limits.MAX_MESSAGE_GROUP_CHARS},
    )

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
        try:
            if "message_group" in attrs:
                limits.check_message_group(attrs["message_group"])
        except limits.LimitError as error:
            raise serializers.ValidationError({"message_group": [str(error)]}) from None
        try:
            limits.check_keys(attrs.get("keys", []))
            limits.check_properties(attrs.get("properties", {}))
        except limits.LimitError as error:
            raise serializers.ValidationError({error.field: [str(error)]}) from None
        attrs["message"] = OutgoingMessage(
            producer_group=attrs["producer_group"],
            body=body,
            body_is_binary="body_base64" in attrs,
            tags=tags,
            keys=attrs.get("keys", []),
            properties=attrs.get("properties", {}),
            message_group=attrs.get("message_group", ""),
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
    check_immunity_seconds = StrictIntegerField(
        required=False, min_value=0, max_value=limits.MAX_CHECK_IMMUNITY_SECONDS
    )


# Batches (CONTRACT: batch endpoints) ------------------------------------------------------------


class BatchMessageIn(MessageIn):
    """One message of a batch send: the batch names the producer group once."""

    producer_group = None  # type: ignore[assignment]  # removes MessageIn's field

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return super().validate({**attrs, "producer_group": ""})  # set by the batch


class BatchTransactionIn(BatchMessageIn):
    """One half message of a batch prepare: the batch names the group and the topic once."""

    check_immunity_seconds = StrictIntegerField(
        required=False, min_value=0, max_value=limits.MAX_CHECK_IMMUNITY_SECONDS
    )


def _batch_size_checked(attrs: dict[str, Any]) -> dict[str, Any]:
    """The batch's bodies within TXHUB_MAX_BATCH_BYTES, each message given the batch's group."""
    try:
        limits.check_batch_bytes(sum(len(item["message"].body) for item in attrs["messages"]))
    except limits.LimitError as error:
        raise PayloadTooLarge(str(error)) from None
    group = attrs["producer_group"]
    for item in attrs["messages"]:
        item["message"] = replace(item["message"], producer_group=group)
        item["producer_group"] = group
    return attrs


class SendBatchIn(StrictSerializer):
    producer_group = NameField("producer_group")
    messages = StrictListField(
        child=BatchMessageIn(), max_length=limits.MAX_BATCH_MESSAGES, allow_empty=False
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return _batch_size_checked(attrs)


class PrepareBatchIn(StrictSerializer):
    producer_group = NameField("producer_group")
    topic = NameField("topic")
    messages = StrictListField(
        child=BatchTransactionIn(), max_length=limits.MAX_BATCH_MESSAGES, allow_empty=False
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return _batch_size_checked(attrs)


class ResolveBatchIn(StrictSerializer):
    transaction_ids = StrictListField(
        child=StrictUUIDField(),
        max_length=limits.MAX_BATCH_MESSAGES,
        allow_empty=False,
        schema={"uniqueItems": True},
    )
    reason = _text(required=False, allow_blank=True, max_length=limits.MAX_REASON_CHARS)

    def validate_transaction_ids(self, value: list[Any]) -> list[Any]:
        try:
            return limits.check_id_batch(value)
        except limits.LimitError as error:
            raise serializers.ValidationError(str(error)) from None


class ReasonIn(StrictSerializer):
    reason = _text(required=False, allow_blank=True, max_length=limits.MAX_REASON_CHARS)


class TopicIn(StrictSerializer):
    name = NameField("name")
    queues = StrictIntegerField(
        required=False,
        default=limits.DEFAULT_QUEUES,
        min_value=limits.MIN_QUEUES,
        max_value=limits.MAX_QUEUES,
    )


class ProducerGroupIn(StrictSerializer):
    name = NameField("name")
    # Optional: a group whose producers are RocketMQ clients is checked over their stream.
    check_url = UrlField(required=False)


class ProducerGroupPatchIn(StrictSerializer):
    check_url = UrlField()


class ConsumerGroupIn(StrictSerializer):
    name = NameField("name")
    max_delivery_attempts = StrictIntegerField(
        required=False,
        default=limits.DEFAULT_DELIVERY_ATTEMPTS,
        min_value=limits.MIN_DELIVERY_ATTEMPTS,
        max_value=limits.MAX_DELIVERY_ATTEMPTS,
    )
    consume_from = serializers.ChoiceField(
        choices=ConsumeFrom.choices, required=False, default=ConsumeFrom.FIRST
    )
    fifo = StrictBooleanField(
        required=False,
        default=False,
        help_text="Receive each message group's messages in order, one at a time.",
    )


class TopicBindingsIn(StrictSerializer):
    """PUT .../topics: the whole list of topics a group may use; [] unbinds (any topic)."""

    MAX_TOPICS = limits.MAX_BOUND_TOPICS
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
    name = _text(max_length=limits.MAX_NAME_CHARS, pattern=limits.TOKEN_NAME_SCHEMA_PATTERN)
    scopes = StrictListField(
        child=_text(pattern=f"^(?:{limits.SCOPE_PATTERN})$"),
        allow_empty=False,
        max_length=limits.MAX_SCOPES,
    )

    def validate_name(self, value: str) -> str:
        # Reported with the body's other fields; token_create checks it again (decision 0106).
        try:
            return limits.check_token_name(value)
        except limits.LimitError as error:
            raise serializers.ValidationError(str(error)) from None

    def validate_scopes(self, value: list[str]) -> list[str]:
        try:
            return limits.check_scopes(value)
        except limits.LimitError as error:
            raise serializers.ValidationError(str(error)) from None


class ReceiveIn(StrictSerializer):
    topic = NameField("topic")
    max_messages = StrictIntegerField(
        required=False,
        default=limits.DEFAULT_RECEIVE_MESSAGES,
        min_value=1,
        max_value=limits.MAX_RECEIVE_MESSAGES,
    )
    invisible_seconds = StrictIntegerField(
        required=False,
        default=limits.DEFAULT_INVISIBLE_SECONDS,
        min_value=limits.MIN_INVISIBLE_SECONDS,
        max_value=limits.MAX_INVISIBLE_SECONDS,
    )
    wait_seconds = StrictIntegerField(
        required=False, default=0, min_value=0, max_value=limits.MAX_WAIT_SECONDS
    )
    tag_expression = _text(
        required=False,
        default="*",
        max_length=limits.MAX_TAG_EXPRESSION_CHARS,
        pattern=limits.TAG_EXPRESSION_SCHEMA_PATTERN,
    )

    def validate_tag_expression(self, value: str) -> frozenset[str] | None:
        try:
            return limits.check_tag_expression(value)
        except limits.LimitError as error:
            raise serializers.ValidationError(str(error)) from None


class AckIn(StrictSerializer):
    receipt_handles = StrictListField(
        child=_text(max_length=limits.MAX_RECEIPT_HANDLE_CHARS),
        allow_empty=False,
        max_length=limits.MAX_ACK_HANDLES,
    )


class ChangeInvisibleIn(StrictSerializer):
    receipt_handle = _text(max_length=limits.MAX_RECEIPT_HANDLE_CHARS)
    invisible_seconds = StrictIntegerField(
        min_value=limits.MIN_INVISIBLE_SECONDS, max_value=limits.MAX_INVISIBLE_SECONDS
    )


class PageIn(StrictSerializer):
    page = QueryIntegerField(required=False, min_value=1)
    page_size = QueryIntegerField(required=False, min_value=1, max_value=limits.MAX_PAGE_SIZE)


class TransactionListIn(StrictSerializer):
    producer_group = NameField("producer_group", required=False)
    state = serializers.ChoiceField(choices=TransactionState.choices, required=False)
    older_than_seconds = QueryIntegerField(required=False, min_value=0)
    page = QueryIntegerField(required=False, min_value=1)
    page_size = QueryIntegerField(required=False, min_value=1, max_value=limits.MAX_PAGE_SIZE)
