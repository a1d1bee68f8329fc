"""Console pages for topics, producer groups, consumer groups and API tokens.

Reads go through selectors, writes through apps.broker.services.registry (the API's write path);
every write is a POST, CSRF-protected, and refused on the server to users who are not operators.
"""

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.forms import Form
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from apps.broker import access, limits, selectors
from apps.broker.models import ApiToken, ConsumerGroup, Door, ProducerGroup, Topic
from apps.broker.services import callbacks, clients, credentials, dead_letters, registry
from apps.broker.services.audit import Origin, origin_of_request
from apps.broker.services.errors import BrokerError, NotFound
from apps.console.forms import (
    CheckUrlForm,
    ConsumerGroupDeleteForm,
    ConsumerGroupEditForm,
    ConsumerGroupForm,
    ProducerGroupForm,
    TokenForm,
    TopicBindingsForm,
    TopicForm,
)
from apps.console.invisible import name_invisible
from apps.console.roles import can_act
from apps.console.views import viewer_required


def operator_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @viewer_required
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not can_act(request.user):
            raise PermissionDenied("Only txhub operators can change the configuration.")
        return view(request, *args, **kwargs)

    return wrapped


def origin(request: HttpRequest) -> Origin:
    """Who acts, for the audit record of the writes that keep one (docs/decisions/0039)."""
    return origin_of_request(request, door=Door.CONSOLE)


def _form_post(
    request: HttpRequest,
    form: Form,
    write: Callable[[dict[str, Any]], str],
    *,
    done: HttpResponse,
    title: str,
) -> HttpResponse:
    """One registry write from a posted form: on success a message and `done`; otherwise the form
    again with its errors, service refusals (a name taken, a check URL refused) among them, and a
    "Back" to where `done` leads (the page the form was on), which needs no script: this page's
    own URL takes POST only (docs/decisions/0103)."""
    if form.is_valid():
        try:
            messages.success(request, write(form.cleaned_data))
            return done
        except BrokerError as error:
            form.add_error(None, error.message)
    context = {"form": form, "title": title, "back": done["Location"]}
    return render(request, "console/form_page.html", context)


# Topics ------------------------------------------------------------------------------------------


@viewer_required
def topic_list(request: HttpRequest) -> HttpResponse:
    ordered = list(Topic.objects.order_by("name"))
    offsets = selectors.topics_queue_offsets(topics=ordered)
    topics = [{"topic": topic, "queues": offsets[topic.pk]} for topic in ordered]
    return render(
        request,
        "console/topics.html",
        {"topics": topics, "form": TopicForm(), "can_act": can_act(request.user)},
    )


@require_POST
@operator_required
def topic_create(request: HttpRequest) -> HttpResponse:
    def write(data: dict[str, Any]) -> str:
        topic = registry.topic_create(**data)
        return f"Topic {topic.name} created with {topic.queues} queues."

    return _form_post(
        request, TopicForm(request.POST), write, done=redirect("console:topics"), title="New topic"
    )


# Producer groups ---------------------------------------------------------------------------------


@viewer_required
def producer_group_list(request: HttpRequest) -> HttpResponse:
    acts = can_act(request.user)
    # The check URL whole only to who may change it, so the edit form keeps it whole; masked
    # for viewers (docs/decisions/0079).
    groups = [
        {
            "group": group,
            "shown_url": registry.producer_group_check_url_shown(group=group, may_change=acts),
            # A name the rule refuses is listed without links or forms: no URL can carry it (0114).
            "named": limits.is_allowed_name(group.name),
        }
        for group in ProducerGroup.objects.order_by("name").prefetch_related("topics")
    ]
    return render(
        request,
        "console/producer_groups.html",
        {
            "groups": groups,
            "producers": clients.clients_connected().filter(client_type="PRODUCER"),
            "form": ProducerGroupForm(),
            "can_act": acts,
        },
    )


def _show_secret_once(request: HttpRequest, group: ProducerGroup, what: str) -> None:
    # Shown in the next page only (a session message), never stored anywhere readable again.
    messages.info(request, f"{what} signing secret of {group.name}: {group.signing_secret}")


@require_POST
@operator_required
def producer_group_create(request: HttpRequest) -> HttpResponse:
    def write(data: dict[str, Any]) -> str:
        group = registry.producer_group_create(**data)
        _show_secret_once(request, group, "The")
        return f"Producer group {group.name} created. Copy its signing secret now."

    return _form_post(
        request,
        ProducerGroupForm(request.POST),
        write,
        done=redirect("console:producer-groups"),
        title="New producer group",
    )


@require_POST
@operator_required
def producer_group_edit(request: HttpRequest, name: str) -> HttpResponse:
    def write(data: dict[str, Any]) -> str:
        registry.producer_group_update(name=name, **data, origin=origin(request))
        return f"Check URL of {name} changed."

    return _form_post(
        request,
        CheckUrlForm(request.POST),
        write,
        done=redirect("console:producer-groups"),
        title=f"Edit {name}",
    )


def _bindings_text(group: ProducerGroup | ConsumerGroup) -> str:
    return " ".join(sorted(topic.name for topic in group.topics.all()))


def _bound_message(name: str, topics: list[str]) -> str:
    if not topics:
        return f"{name} is bound to no topic: it may use any topic."
    return f"{name} may now use only: {', '.join(sorted(set(topics)))}."


@require_POST
@operator_required
def producer_group_topics(request: HttpRequest, name: str) -> HttpResponse:
    def write(data: dict[str, Any]) -> str:
        registry.producer_group_bind_topics(
            name=name, topics=data["topics"], origin=origin(request)
        )
        return _bound_message(name, data["topics"])

    return _form_post(
        request,
        TopicBindingsForm(request.POST),
        write,
        done=redirect("console:producer-groups"),
        title=f"Topics of {name}",
    )


def _confirmation(request: HttpRequest, *, question: str, warning: str, back: str) -> HttpResponse:
    """The page that asks before a change the list offers in one click, whose form POSTs to this
    same URL: the server asks, so no script is needed to ask (docs/decisions/0114). The question
    names the object's invisible characters (docs/decisions/0092)."""
    context = {"question": question, "warning": warning, "back": back}
    return render(request, "console/confirm_change.html", context)


@require_http_methods(["GET", "POST"])
@operator_required
def producer_group_rotate(request: HttpRequest, name: str) -> HttpResponse:
    if request.method == "GET":
        group = selectors.producer_group_get(name=name)  # unknown: the console's not-found page
        return _confirmation(
            request,
            question=f"Rotate the signing secret of {name_invisible(group.name)}?",
            warning="A new secret signs its check-backs from now on; the old one keeps "
            "signing for a while, so its producers can change over.",
            back=reverse("console:producer-groups"),
        )
    try:
        group = registry.producer_group_rotate_secret(name=name, origin=origin(request))
    except BrokerError as error:  # unknown group; Redis unreachable (nothing was rotated)
        messages.error(request, error.message)
        return redirect("console:producer-groups")
    _show_secret_once(request, group, "The new")
    messages.success(request, f"Secret of {name} rotated; the old one keeps signing for a while.")
    return redirect("console:producer-groups")


@require_POST
@operator_required
def producer_group_test(request: HttpRequest, name: str) -> HttpResponse:
    group = selectors.producer_group_get(name=name)
    result = callbacks.checkback_test(group=group)
    # Only operators get here (they may change the URL), but the message asks the one rule too.
    url = registry.producer_group_check_url_shown(group=group, may_change=can_act(request.user))
    if result.reached:
        text = (
            f"Test callback to {url}: HTTP {result.status}, answer {result.answer}"
            f"{' (' + result.error + ')' if result.error else ''}, {result.latency_ms} ms."
        )
    else:
        text = f"Test callback to {url} did not reach it: {result.error}."
    (messages.success if result.reached and result.status == 200 else messages.warning)(
        request, text
    )
    return redirect("console:producer-groups")


# Consumer groups ---------------------------------------------------------------------------------


@viewer_required
def consumer_group_list(request: HttpRequest) -> HttpResponse:
    lag_rows = selectors.consumer_lag()
    groups = [
        {
            "group": group,
            # A name the rule refuses is listed without a link: no URL can carry it (0114).
            "named": limits.is_allowed_name(group.name),
            **{
                key: sum(row[key] for row in lag_rows if row["group"] == group.name)
                for key in ("lag", "in_flight", "dlq")
            },
        }
        for group in ConsumerGroup.objects.order_by("name").prefetch_related("topics")
    ]
    return render(
        request,
        "console/consumer_groups.html",
        {"groups": groups, "form": ConsumerGroupForm(), "can_act": can_act(request.user)},
    )


@viewer_required
def consumer_group_detail(request: HttpRequest, name: str) -> HttpResponse:
    try:
        group = selectors.consumer_group_get(name=name)
    except NotFound:
        return render(request, "console/not_found.html", status=404)
    return render(
        request,
        "console/consumer_group_detail.html",
        {
            "group": group,
            "status": selectors.consumer_group_status(group=group),
            "held": selectors.held_message_groups(group=group) if group.fifo else [],
            "dlq": selectors.dlq_list(group=group)[:200],
            "consumers": clients.clients_connected(group=group.name).exclude(
                client_type="PRODUCER"
            ),
            "form": ConsumerGroupEditForm(
                initial={"max_delivery_attempts": group.max_delivery_attempts}
            ),
            "topics": sorted(topic.name for topic in group.topics.all()),
            "topics_form": TopicBindingsForm(initial={"topics": _bindings_text(group)}),
            "can_act": can_act(request.user),
        },
    )


@require_POST
@operator_required
def consumer_group_create(request: HttpRequest) -> HttpResponse:
    def write(data: dict[str, Any]) -> str:
        group = registry.consumer_group_create(**data)
        return f"Consumer group {group.name} created."

    return _form_post(
        request,
        ConsumerGroupForm(request.POST),
        write,
        done=redirect("console:consumer-groups"),
        title="New consumer group",
    )


@require_POST
@operator_required
def consumer_group_edit(request: HttpRequest, name: str) -> HttpResponse:
    def write(data: dict[str, Any]) -> str:
        group = registry.consumer_group_update(name=name, **data)
        return f"{name} now allows {group.max_delivery_attempts} attempts."

    return _form_post(
        request,
        ConsumerGroupEditForm(request.POST),
        write,
        done=redirect("console:consumer-group", name=name),
        title=f"Edit {name}",
    )


@operator_required
def consumer_group_delete(request: HttpRequest, name: str) -> HttpResponse:
    """The registry's one deletion (docs/decisions/0088), once the group's name is typed again."""
    try:
        group = selectors.consumer_group_get(name=name)
    except NotFound:
        return render(request, "console/not_found.html", status=404)
    form = ConsumerGroupDeleteForm(request.POST or None, group=name)
    if request.method == "POST" and form.is_valid():
        try:
            registry.consumer_group_delete(name=name, origin=origin(request))
        except BrokerError as error:  # gone meanwhile; Redis unreachable (nothing was deleted)
            messages.error(request, f"Nothing deleted: {error.message}")
            return redirect("console:consumer-groups")
        messages.success(request, f"Consumer group {name} deleted, with what it held.")
        return redirect("console:consumer-groups")
    status = selectors.consumer_group_status(group=group)
    return render(
        request,
        "console/consumer_group_delete.html",
        {
            "group": group,
            "form": form,
            **{key: sum(row[key] for row in status) for key in ("lag", "in_flight", "dlq")},
        },
    )


@require_POST
@operator_required
def consumer_group_topics(request: HttpRequest, name: str) -> HttpResponse:
    def write(data: dict[str, Any]) -> str:
        registry.consumer_group_bind_topics(
            name=name, topics=data["topics"], origin=origin(request)
        )
        return _bound_message(name, data["topics"])

    return _form_post(
        request,
        TopicBindingsForm(request.POST),
        write,
        done=redirect("console:consumer-group", name=name),
        title=f"Topics of {name}",
    )


@require_POST
@operator_required
def dlq_resend(request: HttpRequest, name: str, msg_id: str) -> HttpResponse:
    group = selectors.consumer_group_get(name=name)
    try:
        dead_letters.dlq_resend(group=group, msg_id=msg_id, origin=origin(request))
        messages.success(request, f"{msg_id} is back in {name}'s queue, with fresh attempts.")
    except BrokerError as error:
        messages.warning(request, f"Nothing done: {error.message}")
    return redirect("console:consumer-group", name=name)


# Tokens ------------------------------------------------------------------------------------------


@viewer_required
def token_list(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "console/tokens.html",
        {
            "tokens": ApiToken.objects.order_by("revoked_at", "name", "id"),
            # A token scheduled for revocation may still be revoked now (decision 0108), and
            # its row reads "revokes at" (decision 0114).
            "revocable": set(
                ApiToken.objects.filter(access.not_revoked_by(timezone.now())).values_list(
                    "id", flat=True
                )
            ),
            "form": TokenForm(),
            "can_act": can_act(request.user),
        },
    )


@require_POST
@operator_required
def token_create(request: HttpRequest) -> HttpResponse:
    def write(data: dict[str, Any]) -> str:
        token, raw = registry.token_create(**data, origin=origin(request))
        messages.info(request, f"Token {token.name}: {raw}")
        keys = credentials.of(token)
        messages.info(
            request,
            f"RocketMQ credentials of {token.name}: access key {keys['access_key']}, "
            f"secret key {keys['secret_key']}",
        )
        return "Token created. Copy it and its secret key now: they are not shown again."

    return _form_post(
        request, TokenForm(request.POST), write, done=redirect("console:tokens"), title="New token"
    )


@require_http_methods(["GET", "POST"])
@operator_required
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    if request.method == "GET":
        token = ApiToken.objects.filter(pk=token_id).first()
        if token is None:
            return render(request, "console/not_found.html", status=404)
        return _confirmation(
            request,
            question=f"Revoke token {name_invisible(token.name)}?",
            warning="It stops working at once, over REST and gRPC alike; this cannot be undone.",
            back=reverse("console:tokens"),
        )
    try:
        registry.token_revoke(token_id=token_id, origin=origin(request))
    except BrokerError as error:  # unknown token; Redis unreachable (nothing was revoked)
        messages.error(request, error.message)
    else:
        messages.success(request, f"Token {token_id} revoked: it stops working at once.")
    return redirect("console:tokens")
