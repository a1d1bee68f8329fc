"""Batch endpoints: many messages (or transactions) per request, each validated before any is
stored, stored in one database transaction, answered in the order given (CONTRACT section 2,
"Batches"). The same checks, in the same order, as the single-message views they multiply."""

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.broker import access, selectors
from apps.broker.api import output
from apps.broker.api import serializers as inputs
from apps.broker.api.auth import require
from apps.broker.api.errors import error_body
from apps.broker.api.views import (
    ERRORS,
    IDEMPOTENCY_KEY,
    epoch,
    precheck_large_body,
    producer_actor,
    stored_once,
    token_user,
    validated,
)
from apps.broker.services import delivery, sending, transactions
from apps.broker.services.transactions import Outcome, Prepared


def _results(name: str, item: type[serializers.Serializer[Any]]) -> Any:
    return inline_serializer(name, {"results": item(many=True)})


class SendBatchView(APIView):
    @extend_schema(
        operation_id="v1_topics_messages_batch_create",
        request=inputs.SendBatchIn,
        parameters=[IDEMPOTENCY_KEY],
        responses={
            201: _results("SendBatchOut", output.SendOut),
            409: None,
            413: None,
            **ERRORS,
        },
    )
    def post(self, request: Request, topic: str) -> Response:
        precheck_large_body(request, "produce")
        data = validated(inputs.SendBatchIn, request.data)
        group_name = data["producer_group"]
        require(request, "produce", group_name)
        start = timezone.now()
        messages = [
            (
                item["message"],
                delivery.delivery_time(
                    message=item["message"],
                    delay_level=item.get("delay_level"),
                    deliver_at=item.get("deliver_at"),
                    start=start,
                ),
            )
            for item in data["messages"]
        ]
        at = epoch(request)
        access.topic_allowed(kind="produce", group=group_name, topic=topic, epoch=at)
        topic_row = selectors.topic_get(name=topic, epoch=at)
        group = selectors.producer_group_get(name=group_name, epoch=at)

        def send() -> dict[str, Any]:
            sent = sending.message_send_batch(topic=topic_row, messages=messages)
            return {"results": output.render_many(output.SendOut, sent)}

        return stored_once(request, group, send, failpoint="after_send_before_answer")


class PrepareBatchView(APIView):
    @extend_schema(
        operation_id="v1_transactions_batch_create",
        request=inputs.PrepareBatchIn,
        parameters=[IDEMPOTENCY_KEY],
        responses={
            201: _results("PrepareBatchOut", output.PreparedOut),
            409: None,
            413: None,
            **ERRORS,
        },
    )
    def post(self, request: Request) -> Response:
        precheck_large_body(request, "produce")
        data = validated(inputs.PrepareBatchIn, request.data)
        group_name = data["producer_group"]
        require(request, "produce", group_name)
        start = timezone.now()
        for item in data["messages"]:
            # Checked now (TXHUB_MAX_DELAY), applied from the commit on.
            delivery.delivery_time(
                message=item["message"],
                delay_level=item.get("delay_level"),
                deliver_at=item.get("deliver_at"),
                start=start,
            )
        at = epoch(request)
        access.topic_allowed(kind="produce", group=group_name, topic=data["topic"], epoch=at)
        topic = selectors.topic_get(name=data["topic"], epoch=at)
        group = selectors.producer_group_get(name=group_name, epoch=at)
        items = [
            Prepared(
                message=item["message"],
                check_immunity_seconds=item.get("check_immunity_seconds"),
                delay_level=item.get("delay_level"),
                deliver_at=item.get("deliver_at"),
            )
            for item in data["messages"]
        ]

        def prepare() -> dict[str, Any]:
            halves = transactions.transaction_prepare_batch(
                producer_group=group, topic=topic, items=items, actor=producer_actor(request)
            )
            return {"results": output.render_many(output.PreparedOut, halves)}

        return stored_once(request, group, prepare, failpoint="after_half_insert")


RESOLVE_BATCH_OUT = inline_serializer(
    "ResolveBatchOut",
    {
        "results": inline_serializer(
            "ResolveBatchItemOut",
            {
                "transaction_id": serializers.UUIDField(),
                "status": serializers.IntegerField(help_text="200, or the error's own status"),
                "result": output.ResolutionOut(required=False),
                "error": serializers.DictField(
                    required=False, help_text="the contract's error envelope's `error` object"
                ),
            },
            many=True,
        )
    },
)


def _outcome_out(outcome: Outcome) -> dict[str, Any]:
    if outcome.error is not None:
        body = error_body(outcome.error.code, outcome.error.message, outcome.error.details)
        return {
            "transaction_id": str(outcome.transaction_id),
            "status": outcome.error.status,
            **body,
        }
    return {
        "transaction_id": str(outcome.transaction_id),
        "status": status.HTTP_200_OK,
        "result": output.render(output.ResolutionOut, outcome.resolution),
    }


class ResolveBatchView(APIView):
    commit = True

    @extend_schema(request=inputs.ResolveBatchIn, responses={200: RESOLVE_BATCH_OUT, **ERRORS})
    def post(self, request: Request) -> Response:
        precheck_large_body(request, "produce")
        data = validated(inputs.ResolveBatchIn, request.data)
        outcomes = transactions.transaction_resolve_batch(
            transaction_ids=data["transaction_ids"],
            commit=self.commit,
            actor=producer_actor(request),
            reason=data.get("reason", ""),
            producer_groups=token_user(request).groups("produce"),
        )
        return Response({"results": [_outcome_out(outcome) for outcome in outcomes]})


class CommitBatchView(ResolveBatchView):
    commit = True

    @extend_schema(
        operation_id="v1_transactions_commit_batch",
        request=inputs.ResolveBatchIn,
        responses={200: RESOLVE_BATCH_OUT, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        return super().post(request)


class RollbackBatchView(ResolveBatchView):
    commit = False

    @extend_schema(
        operation_id="v1_transactions_rollback_batch",
        request=inputs.ResolveBatchIn,
        responses={200: RESOLVE_BATCH_OUT, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        return super().post(request)
