"""REST views of the registry, for the admin scope: topics, producer and consumer groups, their
topic bindings, tokens, and the nightly reconciliation's runs. The message views (send, the
transactions, receive) are views.py, whose helpers and order of checks these share."""

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.broker import selectors
from apps.broker.api import output
from apps.broker.api import serializers as inputs
from apps.broker.api.auth import TokenUser, require_admin
from apps.broker.api.views import ERRORS, Pagination, origin, validated
from apps.broker.models import ApiToken, ConsumerGroup, ProducerGroup, Topic
from apps.broker.services import credentials, registry


class TopicListView(APIView):
    @extend_schema(request=inputs.TopicIn, responses={201: output.TopicOut, 409: None, **ERRORS})
    def post(self, request: Request) -> Response:
        require_admin(request)
        data = validated(inputs.TopicIn, request.data)
        topic = registry.topic_create(name=data["name"], queues=data["queues"])
        return Response(output.TopicOut(topic).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: output.TopicOut(many=True)})
    def get(self, request: Request) -> Response:
        require_admin(request)
        return Response(output.TopicOut(Topic.objects.order_by("name"), many=True).data)


class TopicDetailView(APIView):
    @extend_schema(responses={200: output.TopicDetailOut})
    def get(self, request: Request, name: str) -> Response:
        require_admin(request)
        topic = selectors.topic_get(name=name)
        data = dict(output.TopicOut(topic).data)
        data["queue_offsets"] = selectors.topic_queue_offsets(topic=topic)
        return Response(data)


def shown_to(request: Request) -> dict[str, bool]:
    """The producer group serializers' context: a check URL is whole only to a caller who may
    change it, which is what guards PATCH here, the admin scope (docs/decisions/0079)."""
    caller: TokenUser = request.user  # type: ignore[assignment]
    return {"may_change_check_url": caller.is_admin}


class ProducerGroupListView(APIView):
    @extend_schema(
        request=inputs.ProducerGroupIn, responses={201: output.ProducerGroupSecretOut, 409: None}
    )
    def post(self, request: Request) -> Response:
        require_admin(request)
        data = validated(inputs.ProducerGroupIn, request.data)
        group = registry.producer_group_create(
            name=data["name"], check_url=data.get("check_url", "")
        )
        return Response(
            output.ProducerGroupSecretOut(group, context=shown_to(request)).data,
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(responses={200: output.ProducerGroupOut(many=True)})
    def get(self, request: Request) -> Response:
        require_admin(request)
        groups = ProducerGroup.objects.order_by("name").prefetch_related("topics")
        return Response(output.ProducerGroupOut(groups, many=True, context=shown_to(request)).data)


class ProducerGroupDetailView(APIView):
    @extend_schema(responses={200: output.ProducerGroupOut})
    def get(self, request: Request, name: str) -> Response:
        require_admin(request)
        group = selectors.producer_group_get(name=name)
        return Response(output.ProducerGroupOut(group, context=shown_to(request)).data)

    @extend_schema(request=inputs.ProducerGroupPatchIn, responses={200: output.ProducerGroupOut})
    def patch(self, request: Request, name: str) -> Response:
        require_admin(request)
        data = validated(inputs.ProducerGroupPatchIn, request.data)
        group = registry.producer_group_update(
            name=name, check_url=data["check_url"], origin=origin(request)
        )
        return Response(output.ProducerGroupOut(group, context=shown_to(request)).data)


class ProducerGroupRotateSecretView(APIView):
    @extend_schema(request=None, responses={200: output.ProducerGroupSecretOut})
    def post(self, request: Request, name: str) -> Response:
        require_admin(request)
        group = registry.producer_group_rotate_secret(name=name, origin=origin(request))
        return Response(output.ProducerGroupSecretOut(group, context=shown_to(request)).data)


def topics_to_bind(request: Request) -> list[str]:
    """The topics a binding request names (admin scope). The views call the audited services
    themselves, naming their origin (tests/broker/test_audit.py reads those calls)."""
    require_admin(request)
    topics: list[str] = validated(inputs.TopicBindingsIn, request.data)["topics"]
    return topics


class ProducerGroupTopicsView(APIView):
    @extend_schema(
        request=inputs.TopicBindingsIn, responses={200: output.ProducerGroupOut, **ERRORS}
    )
    def put(self, request: Request, name: str) -> Response:
        """Binds the group to these topics only (replacing its bindings); [] = any topic."""
        bound = registry.producer_group_bind_topics(
            name=name, topics=topics_to_bind(request), origin=origin(request)
        )
        return Response(output.ProducerGroupOut(bound, context=shown_to(request)).data)


class ConsumerGroupTopicsView(APIView):
    @extend_schema(
        request=inputs.TopicBindingsIn, responses={200: output.ConsumerGroupOut, **ERRORS}
    )
    def put(self, request: Request, group: str) -> Response:
        """Binds the group to these topics only (replacing its bindings); [] = any topic."""
        bound = registry.consumer_group_bind_topics(
            name=group, topics=topics_to_bind(request), origin=origin(request)
        )
        return Response(output.ConsumerGroupOut(bound).data)


class ConsumerGroupListView(APIView):
    @extend_schema(
        request=inputs.ConsumerGroupIn, responses={201: output.ConsumerGroupOut, 409: None}
    )
    def post(self, request: Request) -> Response:
        require_admin(request)
        data = validated(inputs.ConsumerGroupIn, request.data)
        group = registry.consumer_group_create(**data)
        return Response(output.ConsumerGroupOut(group).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: output.ConsumerGroupOut(many=True)})
    def get(self, request: Request) -> Response:
        require_admin(request)
        groups = ConsumerGroup.objects.order_by("name").prefetch_related("topics")
        return Response(output.ConsumerGroupOut(groups, many=True).data)


class TokenListView(APIView):
    @extend_schema(
        request=inputs.TokenIn,
        responses={201: output.TokenCreatedOut},
    )
    def post(self, request: Request) -> Response:
        require_admin(request)
        data = validated(inputs.TokenIn, request.data)
        token, raw = registry.token_create(
            name=data["name"], scopes=data["scopes"], origin=origin(request)
        )
        body = {
            "id": token.pk,
            "name": token.name,
            "scopes": token.scopes,
            "token": raw,
            **credentials.of(token),
        }
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: output.TokenOut(many=True)})
    def get(self, request: Request) -> Response:
        require_admin(request)
        return Response(output.TokenOut(ApiToken.objects.order_by("id"), many=True).data)


class TokenDetailView(APIView):
    @extend_schema(responses={204: None})
    def delete(self, request: Request, token_id: int) -> Response:
        require_admin(request)
        registry.token_revoke(token_id=token_id, origin=origin(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


# Reconciliation ----------------------------------------------------------------------------


class ReconciliationListView(APIView):
    pagination_class = Pagination  # for the schema: the list is paginated

    @extend_schema(responses={200: output.ReconciliationRunOut(many=True), **ERRORS})
    def get(self, request: Request) -> Response:
        """Runs of the nightly reconciliation, newest first, with their counts (admin scope)."""
        require_admin(request)
        paginator = Pagination()
        page = paginator.paginate_queryset(selectors.reconciliation_runs(), request, view=self)
        return paginator.get_paginated_response(output.ReconciliationRunOut(page, many=True).data)


class ReconciliationDetailView(APIView):
    @extend_schema(responses={200: output.ReconciliationRunDetailOut, **ERRORS})
    def get(self, request: Request, run_id: int) -> Response:
        """One run with every finding: its kind, the ids involved and an explanation."""
        require_admin(request)
        run = selectors.reconciliation_get(run_id=run_id)
        return Response(output.ReconciliationRunDetailOut(run).data)
