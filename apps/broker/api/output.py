"""Output serializers: the JSON shapes of CONTRACT section 3 (and of the OpenAPI schema)."""

import base64
import operator
from collections.abc import Callable, Mapping
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from rest_framework import serializers
from rest_framework.fields import SkipField

from apps.broker.api.errors import CODES
from apps.broker.models import (
    CommitLogEntry,
    ConsumerGroup,
    DelayedMessage,
    Delivery,
    HalfMessage,
    ProducerGroup,
    RecalledMessage,
)
from apps.broker.services import registry
from apps.broker.services.consuming import Received

_renderers: dict[type[serializers.Serializer[Any]], serializers.Serializer[Any]] = {}


def render(serializer_class: type[serializers.Serializer[Any]], instance: Any) -> dict[str, Any]:
    """`serializer_class(instance).data`, by one instance of the serializer per process: building
    a serializer deep-copies its declared fields (a fifth of a commit's web CPU, profiled);
    representing an object with it changes nothing on it, so threads can share one."""
    serializer = _renderers.get(serializer_class)
    if serializer is None:
        serializer = _renderers.setdefault(serializer_class, serializer_class())
    return dict(serializer.to_representation(instance))


def render_many(serializer_class: type[serializers.Serializer[Any]], items: Any) -> list[Any]:
    """`serializer_class(items, many=True).data`, as `render` does it."""
    return [render(serializer_class, item) for item in items]


_DATETIME = serializers.DateTimeField()


# CompiledOut: DRF's `Serializer.to_representation`, with each field's attribute lookup worked
# out once per serializer instead of per object and field: DRF's `Field.get_attribute` walks
# `source_attrs` through Mapping and callable checks and exception handlers for every field
# of every object, the larger part of a receive's rendering (decision 0027). Every
# value is still turned into JSON by the field's own `to_representation`, and whatever is
# not a plain attribute path (a Mapping, a callable such as a manager's `all`, a missing
# attribute) goes DRF's way, so the output is DRF's (tests/broker/test_lean_paths.py).
# Output serializers are shared per process (`render`), so the plan is made once.
# (A comment, not a docstring: drf-spectacular would put a docstring into every subclass's
# schema description.)
class CompiledOut(serializers.Serializer[Any]):
    use_drf = False  # True on an instance: DRF's own method (the tests' reference)

    def to_representation(self, instance: Any) -> dict[str, Any]:
        if self.use_drf or isinstance(instance, Mapping):
            return dict(super().to_representation(instance))
        plan = self.__dict__.get("_plan")
        if plan is None:
            plan = self.__dict__["_plan"] = [
                (field.field_name, _lookup(field.source_attrs), field)
                for field in self._readable_fields
            ]
        out: dict[str, Any] = {}
        for name, lookup, field in plan:
            try:
                attribute = lookup(instance)
            except (AttributeError, KeyError, ObjectDoesNotExist):  # DRF decides what they mean
                attribute = _DRF_WAY
            if attribute is _DRF_WAY or callable(attribute):
                try:
                    attribute = field.get_attribute(instance)
                except SkipField:
                    continue
            out[name] = None if attribute is None else field.to_representation(attribute)
        return out


_DRF_WAY = object()


def _lookup(source_attrs: list[str]) -> Callable[[Any], Any]:
    if not source_attrs:  # source="*": the object itself
        return lambda instance: instance
    return operator.attrgetter(".".join(source_attrs))


def body_fields(message: HalfMessage | CommitLogEntry) -> dict[str, str]:
    """A message goes out with the body field it came in with."""
    raw = bytes(message.body)
    if message.body_is_binary:
        return {"body_base64": base64.b64encode(raw).decode("ascii")}
    return {"body": raw.decode("utf-8")}


class BodyMixin(CompiledOut):
    """Adds tags and exactly one of body / body_base64: the field the message was sent with."""

    optional_fields = ("body", "body_base64")  # exactly one is present: neither is required

    tags = serializers.SerializerMethodField()
    body = serializers.SerializerMethodField(help_text="UTF-8 text, if it was sent as text")
    body_base64 = serializers.SerializerMethodField(help_text="base64 bytes, if sent as bytes")

    def _message(self, instance: Any) -> HalfMessage | CommitLogEntry:
        return instance  # type: ignore[no-any-return]

    def get_tags(self, instance: Any) -> str | None:
        return self._message(instance).tags or None

    def get_body(self, instance: Any) -> str | None:
        message = self._message(instance)
        return None if message.body_is_binary else bytes(message.body).decode("utf-8")

    def get_body_base64(self, instance: Any) -> str | None:
        message = self._message(instance)
        return base64.b64encode(bytes(message.body)).decode() if message.body_is_binary else None

    def to_representation(self, instance: Any) -> dict[str, Any]:
        data = dict(super().to_representation(instance))
        data.pop("body" if self._message(instance).body_is_binary else "body_base64")
        return data


class OpOut(serializers.Serializer[Any]):
    op = serializers.CharField()
    source = serializers.CharField()  # type: ignore[assignment]  # a field named "source"
    actor = serializers.CharField()
    reason = serializers.CharField()
    detail = serializers.DictField()
    at = serializers.DateTimeField()


class TransactionOut(CompiledOut):
    transaction_id = serializers.UUIDField()
    msg_id = serializers.CharField()
    producer_group = serializers.CharField(source="producer_group.name")
    topic = serializers.CharField(source="topic.name")
    state = serializers.CharField()
    check_times = serializers.IntegerField()
    born_at = serializers.DateTimeField()
    resolved_at = serializers.DateTimeField(allow_null=True)
    resolved_by = serializers.SerializerMethodField()
    message_group = serializers.SerializerMethodField()

    def get_resolved_by(self, half: HalfMessage) -> str | None:
        return half.resolved_by or None

    def get_message_group(self, half: HalfMessage) -> str | None:
        return half.message_group or None


class TransactionDetailOut(TransactionOut):
    history = OpOut(many=True, source="ops.all")


class PreparedOut(TransactionOut):
    queue_id = serializers.IntegerField()


class ResolutionOut(TransactionOut):
    """commit / rollback: the transaction and, once committed, its commit-log position."""

    queue_id = serializers.IntegerField()
    queue_offset = serializers.IntegerField(allow_null=True)
    deliver_at = serializers.DateTimeField(allow_null=True, help_text="set when delayed")

    def to_representation(self, instance: Any) -> dict[str, Any]:
        data = dict(super().to_representation(instance.half))
        data["queue_offset"] = instance.entry.queue_offset if instance.entry else None
        when = instance.deliver_at
        data["deliver_at"] = _DATETIME.to_representation(when) if when else None
        return data


class SendOut(CompiledOut):
    msg_id = serializers.CharField()
    topic = serializers.CharField(source="topic.name")
    queue_id = serializers.IntegerField()
    queue_offset = serializers.IntegerField(allow_null=True)
    status = serializers.SerializerMethodField()
    deliver_at = serializers.DateTimeField()
    message_group = serializers.SerializerMethodField()

    def get_status(self, sent: Any) -> str:
        return "SEND_OK"

    def get_message_group(self, sent: Any) -> str | None:
        group = sent.get("message_group") if isinstance(sent, Mapping) else sent.message_group
        return group or None


class ReceivedOut(BodyMixin):
    msg_id = serializers.CharField(source="message.msg_id")
    receipt_handle = serializers.SerializerMethodField()
    topic = serializers.CharField(source="message.topic.name")
    queue_id = serializers.IntegerField(source="message.queue_id")
    queue_offset = serializers.IntegerField(source="message.queue_offset")
    keys = serializers.ListField(child=serializers.CharField(), source="message.keys")
    properties = serializers.DictField(child=serializers.CharField(), source="message.properties")
    born_at = serializers.DateTimeField(source="message.born_at")
    stored_at = serializers.DateTimeField(source="message.stored_at")
    delivery_attempt = serializers.IntegerField(source="delivery.attempts")
    transaction_id = serializers.UUIDField(source="message.transaction_id", allow_null=True)
    message_group = serializers.SerializerMethodField()

    def get_message_group(self, received: Received) -> str | None:
        return received.message.message_group or None

    def get_receipt_handle(self, received: Received) -> str:
        return received.receipt_handle

    def _message(self, instance: Any) -> CommitLogEntry:
        return instance.message  # type: ignore[no-any-return]


class DeliveryOut(serializers.Serializer[Any]):
    consumer_group = serializers.CharField(source="group.name")
    state = serializers.CharField()
    attempts = serializers.IntegerField()
    invisible_until = serializers.DateTimeField()
    first_received_at = serializers.DateTimeField(allow_null=True)
    last_received_at = serializers.DateTimeField(allow_null=True)
    acked_at = serializers.DateTimeField(allow_null=True)
    dlq_at = serializers.DateTimeField(allow_null=True)


class DlqEntryOut(BodyMixin):
    msg_id = serializers.CharField(source="message.msg_id")
    topic = serializers.CharField(source="topic.name")
    queue_id = serializers.IntegerField(source="message.queue_id")
    queue_offset = serializers.IntegerField(source="message.queue_offset")
    keys = serializers.ListField(child=serializers.CharField(), source="message.keys")
    properties = serializers.DictField(child=serializers.CharField(), source="message.properties")
    attempts = serializers.IntegerField()
    dlq_at = serializers.DateTimeField()

    def _message(self, instance: Any) -> CommitLogEntry:
        return instance.message  # type: ignore[no-any-return]


class CommitLogPositionOut(serializers.Serializer[Any]):
    offset = serializers.IntegerField()
    topic = serializers.CharField(source="topic.name")
    queue_id = serializers.IntegerField()
    queue_offset = serializers.IntegerField()
    stored_at = serializers.DateTimeField()


class RecallOut(serializers.Serializer[Any]):
    """A recall, in a message's trace (docs/decisions/0055)."""

    recalled_at = serializers.DateTimeField()
    recalled_by = serializers.CharField(help_text="The name of the token that recalled it.")
    door = serializers.CharField(help_text="`rest` or `grpc`.")
    deliver_at = serializers.DateTimeField(help_text="When it would have been delivered.")


class RecalledOut(RecallOut):
    """POST /messages/{msg_id}/recall: the message recalled, now or before."""

    msg_id = serializers.CharField()
    topic = serializers.CharField(source="topic.name")
    producer_group = serializers.CharField()
    transaction_id = serializers.UUIDField(allow_null=True)


DT = serializers.DateTimeField()


def message_trace_out(trace: dict[str, Any]) -> dict[str, Any]:
    half: HalfMessage | None = trace["half"]
    entry: CommitLogEntry | None = trace["entry"]
    delayed: DelayedMessage | None = trace["delayed"]
    recalled: RecalledMessage | None = trace["recalled"]
    source: Any = half or entry or delayed or recalled
    deliveries: list[Delivery] = trace["deliveries"]
    return {
        "msg_id": source.msg_id,
        "topic": source.topic.name,
        "producer_group": half.producer_group.name if half else source.producer_group,
        "tags": source.tags or None,
        "message_group": source.message_group or None,
        "keys": source.keys,
        "properties": source.properties,
        **body_fields(source),
        "born_at": DT.to_representation(source.born_at),
        "transaction": TransactionDetailOut(half).data if half else None,
        "commit_log": CommitLogPositionOut(entry).data if entry else None,
        "delayed_until": DT.to_representation(delayed.deliver_at) if delayed else None,
        "recall": render(RecallOut, recalled) if recalled else None,
        "deliveries": DeliveryOut(deliveries, many=True).data,
    }


class TopicOut(serializers.Serializer[Any]):
    name = serializers.CharField()
    queues = serializers.IntegerField()
    created_at = serializers.DateTimeField()


def bound_topics(group: ProducerGroup | ConsumerGroup) -> list[str]:
    """The topics a group is bound to, sorted; [] = unbound, any topic (docs/decisions/0010).
    Reads a prefetch when the caller made one (lists), else one query."""
    return sorted(topic.name for topic in group.topics.all())


# Context `may_change_check_url`: whether the caller may change the check URL (the door's guard
# of that change); absent, the URL is shown masked (docs/decisions/0079).
class ProducerGroupOut(serializers.Serializer[Any]):
    name = serializers.CharField()
    check_url = serializers.SerializerMethodField(
        help_text="Whole to a caller who may change it; to others with its password, query "
        "and fragment shown as ***."
    )
    topics = serializers.SerializerMethodField(
        help_text="Topics the group may send and prepare to; empty: any topic."
    )
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def get_check_url(self, group: ProducerGroup) -> str:
        may_change = bool(self.context.get("may_change_check_url"))
        return registry.producer_group_check_url_shown(group=group, may_change=may_change)

    def get_topics(self, group: ProducerGroup) -> list[str]:
        return bound_topics(group)


class ProducerGroupSecretOut(ProducerGroupOut):
    signing_secret = serializers.CharField(help_text="Shown once.")


class ConsumerGroupOut(serializers.Serializer[Any]):
    name = serializers.CharField()
    max_delivery_attempts = serializers.IntegerField()
    consume_from = serializers.CharField()
    fifo = serializers.BooleanField()
    topics = serializers.SerializerMethodField(
        help_text="Topics the group may receive from; empty: any topic."
    )
    created_at = serializers.DateTimeField()

    def get_topics(self, group: ConsumerGroup) -> list[str]:
        return bound_topics(group)


class TokenOut(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    name = serializers.CharField()
    scopes = serializers.ListField(child=serializers.CharField())
    created_at = serializers.DateTimeField()
    revoked_at = serializers.DateTimeField(allow_null=True)


class ReconciliationFindingOut(serializers.Serializer[Any]):
    kind = serializers.CharField()
    transaction_id = serializers.UUIDField(allow_null=True)
    half_id = serializers.IntegerField(allow_null=True)
    log_offset = serializers.IntegerField(allow_null=True)
    delayed_id = serializers.IntegerField(allow_null=True)
    explanation = serializers.CharField()


class ReconciliationRunOut(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    day = serializers.DateField()
    master = serializers.CharField()
    status = serializers.CharField()
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    counts = serializers.JSONField()
    summary = serializers.JSONField()
    error = serializers.CharField()


class ReconciliationRunDetailOut(ReconciliationRunOut):
    findings = ReconciliationFindingOut(many=True, source="findings.all")


# Shapes the views answer as plain dicts: named here so the OpenAPI schema (and the fuzz test
# that checks every answer against it) describes them field by field.


class ErrorInnerOut(serializers.Serializer[Any]):
    code = serializers.CharField(
        help_text="One per HTTP status (403 and 409 have two): "
        + ", ".join(f"{code} ({status})" for status, code in CODES.items())
        + ", quota_exceeded (403: the producer group keeps its storage quota's worth), "
        "transaction_resolved (409)."
    )
    message = serializers.CharField()
    details = serializers.DictField()


class ErrorOut(serializers.Serializer[Any]):
    """Every error answer: {"error": {"code", "message", "details"}} (CONTRACT section 3)."""

    error = ErrorInnerOut()


class QueueOffsetsOut(serializers.Serializer[Any]):
    queue_id = serializers.IntegerField()
    min_offset = serializers.IntegerField()
    max_offset = serializers.IntegerField()


class TopicDetailOut(TopicOut):
    queue_offsets = QueueOffsetsOut(many=True)


class TokenCreatedOut(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    name = serializers.CharField()
    scopes = serializers.ListField(child=serializers.CharField())
    token = serializers.CharField(help_text="Shown once.")
    access_key = serializers.CharField(help_text="RocketMQ access key (gRPC door).")
    secret_key = serializers.CharField(help_text="RocketMQ secret key (gRPC door). Shown once.")


class ReceivedListOut(serializers.Serializer[Any]):
    messages = ReceivedOut(many=True)


class AckOut(serializers.Serializer[Any]):
    acked = serializers.ListField(child=serializers.CharField())
    invalid = serializers.ListField(child=serializers.CharField())


class ConsumerQueueStatusOut(serializers.Serializer[Any]):
    topic = serializers.CharField()
    queue_id = serializers.IntegerField()
    max_offset = serializers.IntegerField()
    consumer_offset = serializers.IntegerField()
    ready = serializers.IntegerField()
    in_flight = serializers.IntegerField()
    lag = serializers.IntegerField()
    dlq = serializers.IntegerField()


class ConsumerGroupDetailOut(ConsumerGroupOut):
    queues = ConsumerQueueStatusOut(many=True)


class MessageTraceOut(serializers.Serializer[Any]):
    """GET /messages/{msg_id}: the shape message_trace_out() answers."""

    optional_fields = ("body", "body_base64")

    msg_id = serializers.CharField()
    topic = serializers.CharField()
    producer_group = serializers.CharField()
    tags = serializers.CharField(allow_null=True)
    message_group = serializers.CharField(allow_null=True)
    keys = serializers.ListField(child=serializers.CharField())
    properties = serializers.DictField(child=serializers.CharField())
    body = serializers.CharField(required=False, help_text="UTF-8 text, if sent as text")
    body_base64 = serializers.CharField(required=False, help_text="base64, if sent as bytes")
    born_at = serializers.DateTimeField()
    transaction = TransactionDetailOut(
        allow_null=True,
        help_text="null if the message is not transactional or the caller is not its producer",
    )
    commit_log = CommitLogPositionOut(allow_null=True, help_text="null until it is visible")
    delayed_until = serializers.DateTimeField(allow_null=True)
    recall = RecallOut(allow_null=True, help_text="null unless it was recalled before its delivery")
    deliveries = DeliveryOut(
        many=True, help_text="Only the consumer groups the caller's token has scopes for."
    )
