"""Input serializers (validation against the contract's limits) and output serializers.

Inputs are strict: wrong JSON types and unknown fields are refused, never coerced or ignored.
"""

import base64
import binascii
from datetime import datetime
from typing import Any

from rest_framework import serializers

from apps.broker import limits
from apps.broker.api.parsers import PayloadTooLarge
from apps.broker.models import ConsumeFrom, TransactionState
from apps.broker.services.registry import MAX_BOUND_TOPICS
from apps.broker.services.sending import OutgoingMessage


class StrictCharField(serializers.CharField):
    """A JSON string only (DRF's CharField would turn 12 into "12"); never a NUL character,
    which Postgres text and jsonb cannot hold."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        if "\x00" in data:
            raise serializers.ValidationError("NUL characters are not accepted.")
        return str(super().to_internal_value(data))


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer only: no "4", no 4.5, no true."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return int(super().to_internal_value(data))


class StrictSerializer(serializers.Serializer[Any]):
    """Refuses fields it does not know, so a typo ("tag", "delay_levle") is an error."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {name: ["This field is not part of the API."] for name in unknown}
                )
        return super().to_internal_value(data)


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
    keys = serializers.ListField(child=_text(), required=False)
    properties = serializers.DictField(child=_text(allow_blank=True), required=False)
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
        return parsed

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
            raise serializers.ValidationError({"tags": [str(error)]}) from None
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


class ReasonIn(StrictSerializer):
    reason = _text(required=False, allow_blank=True, max_length=2000)


class TopicIn(StrictSerializer):
    name = NameField("name")
    queues = StrictIntegerField(required=False, default=4, min_value=1, max_value=256)


class ProducerGroupIn(StrictSerializer):
    name = NameField("name")
    check_url = serializers.URLField(max_length=2048)


class ProducerGroupPatchIn(StrictSerializer):
    check_url = serializers.URLField(max_length=2048)


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
    scopes = serializers.ListField(child=_text(), allow_empty=False, max_length=100)

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
    receipt_handles = serializers.ListField(
        child=_text(max_length=200), allow_empty=False, max_length=1000
    )


class ChangeInvisibleIn(StrictSerializer):
    receipt_handle = _text(max_length=200)
    invisible_seconds = StrictIntegerField(min_value=10, max_value=43200)


class TransactionListIn(StrictSerializer):
    producer_group = NameField("producer_group", required=False)
    state = serializers.ChoiceField(choices=TransactionState.choices, required=False)
    older_than_seconds = serializers.IntegerField(required=False, min_value=0)
    page = serializers.IntegerField(required=False, min_value=1)
    page_size = serializers.IntegerField(required=False, min_value=1, max_value=500)
