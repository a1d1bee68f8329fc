"""Django admin: everything visible to staff with the model's view permission, and read-only
(writes go through the services: the API and the console); bulk commit and roll back through the
operator service, with a reason asked on an intermediate page."""

from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin.utils import display_for_field
from django.db import models
from django.db.models import ExpressionWrapper, QuerySet
from django.http import HttpRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils import timezone

from apps.broker import access, limits
from apps.broker.admin_site import ShownLogEntry, ShownObject, named
from apps.broker.models import (
    ApiToken,
    AuditRecord,
    CommitLogEntry,
    ConsumerGroup,
    DelayedMessage,
    Door,
    HalfMessage,
    OpRecord,
    ProducerGroup,
    Topic,
)
from apps.broker.services import operator, registry
from apps.broker.services.audit import origin_of_request
from apps.broker.services.errors import BrokerError
from apps.console.forms import ReasonForm
from apps.console.invisible import name_invisible
from apps.console.roles import can_act

# The model fields that may hold a tenant's string (a name, a key, tags, properties, a reason).
TEXT_FIELDS = (models.CharField, models.TextField, models.JSONField)


def _named_column(field: "models.Field[Any, Any]") -> Callable[[Any], str]:
    """What Django would show for the text field `field`, its invisible characters named."""

    @admin.display(description=field.verbose_name, ordering=field.name)
    def shown(obj: Any) -> str:
        value = getattr(obj, field.attname)
        return name_invisible(str(display_for_field(value, field, admin.site.empty_value_display)))

    shown.__name__ = field.name
    return shown


@cache
def _named_columns(model_label: str) -> dict[str, Callable[[Any], str]]:
    """A model's text fields by name, each with its column (docs/decisions/0092): made once, so
    the same column is found again among a page's read-only fields."""
    fields = apps.get_model(model_label)._meta.concrete_fields
    return {field.name: _named_column(field) for field in fields if isinstance(field, TEXT_FIELDS)}


class ShowsInvisibleCharacters(admin.options.BaseModelAdmin):  # type: ignore[type-arg]
    """Every text field of a list or a detail page, and the object's name in the page's title,
    shown with its bidirectional controls and zero-width characters named, by the function the
    console's `visible` filter calls (docs/decisions/0092)."""

    def field_shown(self, request: HttpRequest, field: Any) -> Any:
        """The column or read-only field that shows `field` (a name or a callable)."""
        if isinstance(field, str):
            return _named_columns(self.opts.label).get(field, field)
        return field

    def _shown(self, request: HttpRequest, fields: Sequence[Any]) -> list[Any]:
        return [self.field_shown(request, field) for field in fields]

    def get_list_display(self, request: HttpRequest) -> list[Any]:
        return self._shown(request, super().get_list_display(request))  # type: ignore[misc]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        return self._shown(request, super().get_fields(request, obj))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        return self._shown(request, super().get_readonly_fields(request, obj))

    def render_change_form(
        self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any
    ) -> Any:
        # The object's name in the page's title and heading (a token's __str__ is its name); the
        # breadcrumbs' is named by templates/admin/broker/change_form.html.
        return super().render_change_form(request, _named_page(context), *args, **kwargs)  # type: ignore[misc]

    def render_delete_form(self, request: HttpRequest, context: dict[str, Any]) -> Any:
        return super().render_delete_form(request, _named_page(context))  # type: ignore[misc]

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> Any:
        response = super().history_view(request, object_id, extra_context)  # type: ignore[misc]
        if isinstance(response, TemplateResponse) and response.context_data is not None:
            _named_page(response.context_data)  # rendered later, from this very context
        return response

    def message_user(self, request: HttpRequest, message: Any, *args: Any, **kwargs: Any) -> None:
        # "The consumer group “<name>” was deleted successfully.", and every other message.
        super().message_user(request, named(message), *args, **kwargs)  # type: ignore[misc]


def _named_page(context: dict[str, Any]) -> dict[str, Any]:
    """An admin page's context with every object name it shows named (docs/decisions/0103): its
    title, the object (breadcrumbs, the delete page's question), the objects a deletion takes or
    that protect it, and the history's log entries."""
    for key in ("title", "subtitle", "deleted_objects", "protected"):
        if context.get(key):
            context[key] = named(context[key])
    if context.get("object") is not None:
        context["object"] = ShownObject(context["object"])
    history = context.get("action_list")
    if history is not None:
        history.object_list = [ShownLogEntry(entry) for entry in history.object_list]
    return context


class ReadOnlyAdmin(ShowsInvisibleCharacters, admin.ModelAdmin):  # type: ignore[type-arg]
    """Viewing keeps Django's own check (the model's view or change permission): being staff is
    not enough. Nothing is added, changed or deleted here, whatever the permissions."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class OpRecordInline(ShowsInvisibleCharacters, admin.TabularInline):  # type: ignore[type-arg]
    model = OpRecord
    fields = ("at", "op", "source", "actor", "reason", "detail")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _bulk(action: str, label: str) -> Any:
    @admin.action(description=label)
    def run(
        modeladmin: "admin.ModelAdmin[HalfMessage]",
        request: HttpRequest,
        queryset: QuerySet[HalfMessage],
    ) -> Any:
        if not can_act(request.user):
            modeladmin.message_user(request, "Only txhub operators can act.", messages.ERROR)
            return None
        form = ReasonForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            # One more than a batch may hold is enough to refuse it (the ids only, no bodies).
            ids = list(
                queryset.values_list("transaction_id", flat=True)[: limits.MAX_BATCH_MESSAGES + 1]
            )
            try:
                results = operator.operator_act_many(
                    transaction_ids=ids,
                    action=action,
                    username=request.user.get_username(),
                    reason=form.cleaned_data["reason"],
                )
            except BrokerError as error:
                modeladmin.message_user(request, f"Nothing done: {error.message}", messages.ERROR)
                return None
            for transaction_id, result in zip(ids, results, strict=True):
                level = messages.SUCCESS if result.ok else messages.WARNING
                modeladmin.message_user(request, f"{transaction_id}: {result.message}", level)
            return None
        return TemplateResponse(
            request,
            "admin/broker/reason.html",
            {
                "title": f"{action.capitalize()} {queryset.count()} transaction(s)",
                "queryset": queryset,
                "form": form,
                "action": request.POST.get("action"),
                "opts": modeladmin.model._meta,
            },
        )

    run.__name__ = f"{action}_selected"
    return run


@admin.register(HalfMessage)
class HalfMessageAdmin(ReadOnlyAdmin):
    list_display = (
        "transaction_id",
        "state",
        "producer_group",
        "topic",
        "born_at",
        "check_times",
        "resolved_by",
    )
    list_filter = ("state", "resolved_by", "producer_group", "topic")
    search_fields = ("=transaction_id", "=msg_id")
    list_select_related = ("producer_group", "topic")
    exclude = ("body",)
    inlines = (OpRecordInline,)
    # Offered to whoever may view the list; each one acts only for txhub operators (can_act).
    actions = (
        _bulk("commit", "Commit selected (asks a reason)"),
        _bulk("rollback", "Roll back selected (asks a reason)"),
    )


@admin.register(OpRecord)
class OpRecordAdmin(ReadOnlyAdmin):
    list_display = ("at", "op", "source", "actor", "half", "reason")
    list_filter = ("op", "source")
    list_select_related = ("half",)


@admin.register(CommitLogEntry)
class CommitLogEntryAdmin(ReadOnlyAdmin):
    list_display = ("offset", "topic", "queue_id", "queue_offset", "msg_id", "stored_at")
    list_select_related = ("topic",)
    exclude = ("body",)


@admin.register(DelayedMessage)
class DelayedMessageAdmin(ReadOnlyAdmin):
    list_display = ("msg_id", "topic", "deliver_at")
    exclude = ("body",)


@admin.register(Topic)
class TopicAdmin(ReadOnlyAdmin):
    list_display = ("name", "queues", "created_at")


class BoundTopicsAdmin(ReadOnlyAdmin):
    """Shows a group's topic bindings (edited in the console or the API: one write path)."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).prefetch_related("topics")

    @admin.display(description="topics")
    def bound_topics(self, group: ProducerGroup | ConsumerGroup) -> str:
        return ", ".join(sorted(t.name for t in group.topics.all())) or "any topic"


@admin.register(ProducerGroup)
class ProducerGroupAdmin(BoundTopicsAdmin):
    list_display = ("name", "check_url", "bound_topics", "updated_at")
    exclude = ("signing_secret", "previous_signing_secret")

    def field_shown(self, request: HttpRequest, field: Any) -> Any:
        # The check URL, in the list and on the (read-only) page, as the request's user may see
        # it: whole only to txhub operators, who may change it in the console (decision 0079).
        if field != "check_url":
            return super().field_shown(request, field)
        may_change = can_act(request.user)

        @admin.display(description="check URL", ordering="check_url")
        def check_url(group: ProducerGroup) -> str:
            shown = registry.producer_group_check_url_shown(group=group, may_change=may_change)
            return name_invisible(shown)

        return check_url


@admin.register(ConsumerGroup)
class ConsumerGroupAdmin(BoundTopicsAdmin):
    """A group may be deleted here, one at a time, through the registry's one deletion (its
    locks, its audit record, its waiting receives told; docs/decisions/0088), never Django's
    cascade: by who holds Django's delete permission and is a txhub operator, the role that
    edits groups in the console."""

    list_display = ("name", "fifo", "max_delivery_attempts", "consume_from", "bound_topics")
    list_filter = ("fifo",)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return admin.ModelAdmin.has_delete_permission(self, request, obj) and can_act(request.user)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # a deletion is one group's, on its own page
        return actions

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        # Django's page would list every row the cascade reaches: every delivery the group had.
        what = "with its cursors, deliveries, dead letters and topic bindings"
        shown = [f"Consumer group: {obj}, {what}" for obj in objs]
        return shown, {"consumer groups": len(shown)}, set(), []

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> Any:
        try:
            return super().delete_view(request, object_id, extra_context)
        except BrokerError as error:  # gone meanwhile; Redis unreachable (nothing was deleted)
            self.message_user(request, f"Nothing deleted: {error.message}", messages.ERROR)
            return HttpResponseRedirect(request.path)

    def delete_model(self, request: HttpRequest, obj: ConsumerGroup) -> None:
        self.delete_queryset(request, ConsumerGroup.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ConsumerGroup]) -> None:
        origin = origin_of_request(request, door=Door.ADMIN)
        for name in queryset.values_list("name", flat=True):
            registry.consumer_group_delete(name=name, origin=origin)


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    list_display = ("name", "prefix", "scopes", "created_at", "revoked_at")
    exclude = ("token_hash",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApiToken]:
        # Whether each token is still to be revoked, by the rule the revocation itself asks
        # (access.not_revoked_by, decisions 0108 and 0114), as the console's tokens page does.
        still_live = ExpressionWrapper(
            access.not_revoked_by(timezone.now()), output_field=models.BooleanField()
        )
        tokens: QuerySet[ApiToken] = super().get_queryset(request)
        return tokens.annotate(still_live=still_live)

    def field_shown(self, request: HttpRequest, field: Any) -> Any:
        # `revoked_at`, in the list and on the (read-only) page: a revocation scheduled for later
        # reads "revokes at" its time, as on the console's tokens page (decision 0114).
        if field != "revoked_at":
            return super().field_shown(request, field)
        column = ApiToken._meta.get_field("revoked_at")

        @admin.display(description=column.verbose_name, ordering="revoked_at")
        def revoked_at(token: ApiToken) -> str:
            shown = str(display_for_field(token.revoked_at, column, self.get_empty_value_display()))
            still_live: bool = token.still_live  # type: ignore[attr-defined]  # get_queryset's
            if token.revoked_at is not None and still_live:
                return f"revokes at {shown}"
            return shown

        return revoked_at


@admin.register(AuditRecord)
class AuditRecordAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor", "actor_kind", "door", "address", "action", "target")
    list_filter = ("action", "door", "actor_kind")
    search_fields = ("=actor", "=target")
