"""REST views of messages (send, transactions, receive, the dead-letter queue) and the helpers
every view shares; the registry's views are registry_views.py, the batches' batch_views.py. Each
parses and checks input, checks the scope, calls one service or selector, answers.

Order of checks everywhere: 401 (no token) -> 400 (bad input) -> 403 (scope for the named group)
-> 404 (unknown topic / group / id), so nothing is stored unless every check passed.
"""

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.broker import access, limits, selectors, waiting
from apps.broker.api import long_poll, output
from apps.broker.api import serializers as inputs
from apps.broker.api.auth import TokenUser, require, require_admin
from apps.broker.api.parsers import content_length, single_valued
from apps.broker.models import ConsumerGroup, Door, ProducerGroup, Resolver
from apps.broker.services import (
    consuming,
    dead_letters,
    delivery,
    idempotency,
    recall,
    registry,
    sending,
    transactions,
)
from apps.broker.services.audit import Origin, origin_of_request
from apps.broker.services.transactions import Actor

ERRORS = {
    400: OpenApiResponse(description="invalid_request"),
    401: OpenApiResponse(description="unauthenticated"),
    403: OpenApiResponse(description="forbidden"),
    404: OpenApiResponse(description="not_found"),
}


_validators = threading.local()


def validated(serializer_class: type[serializers.Serializer[Any]], data: Any) -> dict[str, Any]:
    """`serializer_class(data=data)`'s validated data, or its 400. One serializer per class and
    thread: building one deep-copies its declared fields (a tenth of a prepare's web CPU,
    profiled); validating leaves nothing on it but its last input and result, reset here."""
    serializers_of_thread = _validators.__dict__.setdefault("by_class", {})
    serializer = serializers_of_thread.get(serializer_class)
    if serializer is None:
        serializer = serializers_of_thread[serializer_class] = serializer_class()
    for attribute in ("_validated_data", "_errors", "_data"):
        serializer.__dict__.pop(attribute, None)
    serializer.initial_data = data
    try:
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)
    finally:
        del serializer.initial_data


# A body above this size is parsed only for a token that could use the endpoint at all (OWASP
# API4): no normal request to a consumer endpoint comes near it, and for smaller bodies the
# documented order 401 -> 400 -> 403 -> 404 holds unchanged.
LARGE_BODY_BYTES = 64 * 1024


def precheck_large_body(request: Request, kind: access.Kind, group: str | None = None) -> None:
    """403 before reading a large body when the token cannot use it: no `kind` scope at all,
    or (group known from the URL) no scope for that group."""
    if content_length(request) <= LARGE_BODY_BYTES:
        return
    if group is not None:
        require(request, kind, group)
    else:
        token_user(request).require_some(kind)


def token_user(request: Request) -> TokenUser:
    return request.user  # type: ignore[return-value]


def epoch(request: Request) -> str | None:
    """The configuration epoch this request's auth read: the key of the cached lookups."""
    return token_user(request).config_epoch


def producer_actor(request: Request) -> Actor:
    return Actor(Resolver.PRODUCER, token_user(request).name)


def origin(request: Request) -> Origin:
    """Who calls, for the audit record of the writes that keep one (docs/decisions/0039)."""
    return origin_of_request(request, door=Door.REST)


def stored_once(
    request: Request,
    group: ProducerGroup,
    store: Callable[[], dict[str, Any]],
    *,
    failpoint: str,
) -> Response:
    """201 with what `store` stored; with an Idempotency-Key, at most once per key (a retry
    answers the first answer, marked `Idempotent-Replayed: true`)."""
    key = idempotency.key_of(_raw_headers(request))
    if key is None:
        return Response(store(), status=status.HTTP_201_CREATED)
    answer = idempotency.answer_once(
        group=group,
        key=key,
        fingerprint=idempotency.fingerprint_of(
            method=request.method or "POST", path=request.path, data=request.data
        ),
        status=status.HTTP_201_CREATED,
        run=store,
        failpoint=failpoint,
    )
    headers = {"Idempotent-Replayed": "true"} if answer.replayed else None
    return Response(answer.body, status=status.HTTP_201_CREATED, headers=headers)


class Pagination(PageNumberPagination):
    page_size = limits.DEFAULT_PAGE_SIZE
    page_size_query_param = "page_size"
    max_page_size = limits.MAX_PAGE_SIZE

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        # PageIn's bounds, stated (DRF's own parameters say only "integer").
        bounds = {"page": (1, limits.MAX_INT), "page_size": (1, limits.MAX_PAGE_SIZE)}
        parameters: list[dict[str, Any]] = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            low, high = bounds[parameter["name"]]
            parameter["schema"] = {**parameter["schema"], "minimum": low, "maximum": high}
        return parameters

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> Any:
        # DRF quietly takes page=&page_size=false as the defaults, and any unknown parameter
        # (even a nameless `?=`): a 400 here, like any input. A view that validates query
        # parameters of its own names them in `query_fields`.
        own: frozenset[str] = getattr(view, "query_fields", frozenset())
        query = single_valued(request.query_params)
        validated(inputs.PageIn, {k: v for k, v in query.items() if k not in own})
        return super().paginate_queryset(queryset, request, view)


# Producers ---------------------------------------------------------------------------------


def _raw_headers(request: Request) -> list[tuple[bytes, bytes]]:
    """The request's headers as they came (under ASGI, repeated and underscore names kept), for
    the one reading of Idempotency-Key that both doors share (services/idempotency.key_of)."""
    scope = getattr(getattr(request, "_request", request), "scope", None)
    if scope is not None:
        return list(scope.get("headers", []))
    return [(str(k).lower().encode(), str(v).encode()) for k, v in request.headers.items()]


IDEMPOTENCY_KEY = OpenApiParameter(
    name=idempotency.HEADER,
    location=OpenApiParameter.HEADER,
    required=False,
    type=str,
    pattern=f"^{limits.IDEMPOTENCY_KEY_PATTERN}$",
    description="A retry with the same key and the same request within 24 h answers the first "
    "answer (with `Idempotent-Replayed: true`) and stores nothing; the same key with another "
    "request is 409. 1-255 printable ASCII characters.",
)


class TopicMessagesView(APIView):
    @extend_schema(
        request=inputs.MessageIn,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: output.SendOut, 409: None, 413: None, **ERRORS},
    )
    def post(self, request: Request, topic: str) -> Response:
        precheck_large_body(request, "produce")
        data = validated(inputs.MessageIn, request.data)
        require(request, "produce", data["producer_group"])
        deliver_at = delivery.delivery_time(
            message=data["message"],
            delay_level=data.get("delay_level"),
            deliver_at=data.get("deliver_at"),
            start=timezone.now(),
        )
        at = epoch(request)
        access.topic_allowed(kind="produce", group=data["producer_group"], topic=topic, epoch=at)
        topic_row = selectors.topic_get(name=topic, epoch=at)
        group = selectors.producer_group_get(name=data["producer_group"], epoch=at)

        def send() -> dict[str, Any]:
            sent = sending.message_send(
                topic=topic_row, message=data["message"], deliver_at=deliver_at
            )
            return output.render(output.SendOut, sent)

        return stored_once(request, group, send, failpoint="after_send_before_answer")


class TransactionListView(APIView):
    pagination_class = Pagination  # for the schema: the GET list is paginated
    query_fields = frozenset({"producer_group", "state", "older_than_seconds"})

    @extend_schema(
        request=inputs.TransactionIn,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: output.PreparedOut, 409: None, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        precheck_large_body(request, "produce")
        data = validated(inputs.TransactionIn, request.data)
        require(request, "produce", data["producer_group"])
        # Checked now (TXHUB_MAX_DELAY), applied from the commit on.
        delivery.delivery_time(
            message=data["message"],
            delay_level=data.get("delay_level"),
            deliver_at=data.get("deliver_at"),
            start=timezone.now(),
        )
        at = epoch(request)
        access.topic_allowed(
            kind="produce", group=data["producer_group"], topic=data["topic"], epoch=at
        )
        topic = selectors.topic_get(name=data["topic"], epoch=at)
        group = selectors.producer_group_get(name=data["producer_group"], epoch=at)

        def prepare() -> dict[str, Any]:
            half = transactions.transaction_prepare(
                producer_group=group,
                topic=topic,
                message=data["message"],
                actor=producer_actor(request),
                check_immunity_seconds=data.get("check_immunity_seconds"),
                delay_level=data.get("delay_level"),
                deliver_at=data.get("deliver_at"),
            )
            return output.render(output.PreparedOut, half)

        return stored_once(request, group, prepare, failpoint="after_half_insert")

    @extend_schema(
        parameters=[inputs.TransactionListIn],
        responses={200: output.TransactionDetailOut(many=True)},
    )
    def get(self, request: Request) -> Response:
        data = validated(inputs.TransactionListIn, single_valued(request.query_params))
        groups = token_user(request).groups("produce")
        if "producer_group" in data:
            require(request, "produce", data["producer_group"])
            groups = frozenset({data["producer_group"]})
        query = selectors.transaction_list(
            producer_groups=groups,
            state=data.get("state"),
            older_than_seconds=data.get("older_than_seconds"),
        )
        paginator = Pagination()
        page = paginator.paginate_queryset(query, request, view=self)
        return paginator.get_paginated_response(output.TransactionDetailOut(page, many=True).data)


class TransactionDetailView(APIView):
    @extend_schema(responses={200: output.TransactionDetailOut, **ERRORS})
    def get(self, request: Request, transaction_id: uuid.UUID) -> Response:
        half = selectors.transaction_get(
            transaction_id=transaction_id,
            producer_groups=token_user(request).groups("produce"),
        )
        return Response(output.TransactionDetailOut(half).data)


class TransactionResolveView(APIView):
    outcome = "commit"

    @extend_schema(
        request=inputs.ReasonIn, responses={200: output.ResolutionOut, 409: None, **ERRORS}
    )
    def post(self, request: Request, transaction_id: uuid.UUID) -> Response:
        precheck_large_body(request, "produce")
        data = validated(inputs.ReasonIn, request.data)
        resolve = (
            transactions.transaction_commit
            if self.outcome == "commit"
            else transactions.transaction_rollback
        )
        resolution = resolve(
            transaction_id=transaction_id,
            actor=producer_actor(request),
            reason=data.get("reason", ""),
            producer_groups=token_user(request).groups("produce"),
        )
        return Response(output.render(output.ResolutionOut, resolution))


class TransactionCommitView(TransactionResolveView):
    outcome = "commit"


class TransactionRollbackView(TransactionResolveView):
    outcome = "rollback"


class TransactionResumeView(APIView):
    @extend_schema(request=inputs.ReasonIn, responses={200: output.TransactionDetailOut, 409: None})
    def post(self, request: Request, transaction_id: uuid.UUID) -> Response:
        user = require_admin(request)
        data = validated(inputs.ReasonIn, request.data)
        transactions.transaction_resume(
            transaction_id=transaction_id,
            actor=Actor(Resolver.OPERATOR, user.name),
            reason=data.get("reason", ""),
        )
        half = selectors.transaction_get(transaction_id=transaction_id)
        return Response(output.TransactionDetailOut(half).data)


class MessageDetailView(APIView):
    @extend_schema(responses={200: output.MessageTraceOut, **ERRORS})
    def get(self, request: Request, msg_id: str) -> Response:
        """The message and its trace, as far as the token's scopes cover it: a producer sees its
        own group's messages with the deliveries of the consumer groups it holds scopes for; a
        consumer sees a committed message on a topic its group may receive from, with its own
        group's deliveries and no transaction history; an admin sees everything."""
        user = token_user(request)
        trace = selectors.message_trace(
            msg_id=msg_id,
            producer_groups=user.groups("produce"),
            consumer_groups=user.groups("consume"),
        )
        return Response(output.message_trace_out(trace))


class MessageRecallView(APIView):
    @extend_schema(request=None, responses={200: output.RecalledOut, 409: None, **ERRORS})
    def post(self, request: Request, msg_id: str) -> Response:
        """Recalls a delayed message not yet delivered: it never will be. Needs a `produce:`
        scope of its producer group; another group's message is 404. Delivered already: 409.
        Recalled already: 200 with that recall (docs/decisions/0055)."""
        precheck_large_body(request, "produce")
        recalled = recall.message_recall(msg_id=msg_id, principal=token_user(request), door="rest")
        return Response(output.render(output.RecalledOut, recalled))


# Consumers ---------------------------------------------------------------------------------


def consumer_group(request: Request, name: str) -> ConsumerGroup:
    require(request, "consume", name)
    return selectors.consumer_group_get(name=name, epoch=epoch(request))


class ReceiveView(APIView):
    @extend_schema(
        request=inputs.ReceiveIn,
        responses={200: output.ReceivedListOut},
    )
    def post(self, request: Request, group: str) -> Response:
        precheck_large_body(request, "consume", group)
        data = validated(inputs.ReceiveIn, request.data)
        group_row = consumer_group(request, group)
        at = epoch(request)
        access.topic_allowed(kind="consume", group=group, topic=data["topic"], epoch=at)
        topic = selectors.topic_get(name=data["topic"], epoch=at)
        since = time.monotonic()
        received, plan = waiting.first_try(
            consuming.WaitPlan(
                group=group_row,
                topic=topic,
                max_messages=data["max_messages"],
                invisible_seconds=data["invisible_seconds"],
                wait_seconds=data["wait_seconds"],
                tags=data["tag_expression"],
                token_id=request.auth if isinstance(request.auth, int) else None,
            )
        )
        # Under ASGI the wait happens on the event loop, holding no thread (api/long_poll.py):
        # the plan goes with the answer. Under WSGI this thread waits (decision 0047).
        if plan is not None and not long_poll.may_wait_outside(request):
            received = waiting.wait_here(plan, since=since)
            plan = None
        response = Response({"messages": output.render_many(output.ReceivedOut, received)})
        if plan is not None:
            long_poll.attach(response, plan)
        return response


class AckView(APIView):
    @extend_schema(
        request=inputs.AckIn,
        responses={200: output.AckOut},
    )
    def post(self, request: Request, group: str) -> Response:
        precheck_large_body(request, "consume", group)
        data = validated(inputs.AckIn, request.data)
        acked, invalid = consuming.message_ack(
            group=consumer_group(request, group), receipt_handles=data["receipt_handles"]
        )
        return Response({"acked": acked, "invalid": invalid})


class ChangeInvisibleView(APIView):
    @extend_schema(request=inputs.ChangeInvisibleIn, responses={200: output.ReceivedOut})
    def post(self, request: Request, group: str) -> Response:
        precheck_large_body(request, "consume", group)
        data = validated(inputs.ChangeInvisibleIn, request.data)
        received = consuming.message_change_invisible(group=consumer_group(request, group), **data)
        return Response(output.render(output.ReceivedOut, received))


class ConsumerGroupDetailView(APIView):
    @extend_schema(responses={200: output.ConsumerGroupDetailOut})
    def get(self, request: Request, group: str) -> Response:
        group_row = consumer_group(request, group)
        data = dict(output.ConsumerGroupOut(group_row).data)
        data["queues"] = selectors.consumer_group_status(group=group_row)
        return Response(data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, group: str) -> Response:
        """Deletes the group with its cursors, deliveries (dead letters too) and topic bindings
        (admin scope), and removes its `consume:` scope from every token: waiting receives answer
        404, later ones of those tokens 403, even if a group of the same name is made again; what
        it held of the commit log goes at the next retention sweep."""
        # One write path, for every door (services/registry.py, docs/decisions/0088).
        require_admin(request)
        registry.consumer_group_delete(name=group, origin=origin(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class DlqListView(APIView):
    pagination_class = Pagination  # for the schema: the list is paginated

    @extend_schema(responses={200: output.DlqEntryOut(many=True)})
    def get(self, request: Request, group: str) -> Response:
        query = selectors.dlq_list(group=consumer_group(request, group))
        paginator = Pagination()
        page = paginator.paginate_queryset(query, request, view=self)
        return paginator.get_paginated_response(output.DlqEntryOut(page, many=True).data)


class DlqResendView(APIView):
    @extend_schema(request=None, responses={200: output.DeliveryOut})
    def post(self, request: Request, group: str, msg_id: str) -> Response:
        delivery = dead_letters.dlq_resend(
            group=consumer_group(request, group), msg_id=msg_id, origin=origin(request)
        )
        return Response(output.DeliveryOut(delivery).data)
