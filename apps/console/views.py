"""The operator console: server-rendered pages over the same selectors and services as the API."""

import base64
import uuid
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from apps.broker import selectors
from apps.broker.services import operator
from apps.broker.services.errors import NotFound
from apps.console.forms import ReasonForm, TransactionFilterForm
from apps.console.roles import can_act, can_view

PREVIEW_BYTES = 4096


def viewer_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @login_required
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not can_view(request.user):
            raise PermissionDenied("You are not in the txhub viewers or operators group.")
        return view(request, *args, **kwargs)

    return wrapped


@viewer_required
def overview(request: HttpRequest) -> HttpResponse:
    return render(request, "console/overview.html", {"stats": selectors.console_overview()})


@viewer_required
def transaction_list(request: HttpRequest) -> HttpResponse:
    form = TransactionFilterForm(request.GET or None)
    filters = (
        {k: v for k, v in form.cleaned_data.items() if v not in ("", None)}
        if form.is_valid()
        else {}
    )
    page = Paginator(selectors.transaction_search(**filters), 50).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "console/transaction_list.html",
        {"form": form, "page": page, "query": query.urlencode(), "can_act": can_act(request.user)},
    )


def body_preview(raw: bytes, is_binary: bool) -> dict[str, Any]:
    shown = raw[:PREVIEW_BYTES]
    if is_binary:
        text = base64.b64encode(shown).decode()
        kind = "base64"
    else:
        text = shown.decode("utf-8", errors="replace")
        kind = "text"
    return {"text": text, "kind": kind, "size": len(raw), "truncated": len(raw) > PREVIEW_BYTES}


@viewer_required
def transaction_detail(request: HttpRequest, transaction_id: uuid.UUID) -> HttpResponse:
    try:
        half = selectors.transaction_get(transaction_id=transaction_id)
    except NotFound:
        return render(request, "console/not_found.html", status=404)
    trace = selectors.message_trace(msg_id=half.msg_id, producer_groups=None, half=half)
    return render(
        request,
        "console/transaction_detail.html",
        {
            "half": half,
            "ops": list(half.ops.all()),
            "trace": trace,
            "body": body_preview(bytes(half.body), half.body_is_binary),
            "can_act": can_act(request.user),
            "actions": _actions_for(half.state),
        },
    )


@viewer_required
def transaction_body(request: HttpRequest, transaction_id: uuid.UUID) -> HttpResponse:
    half = selectors.transaction_get(transaction_id=transaction_id)
    response = HttpResponse(bytes(half.body), content_type="application/octet-stream")
    response["Content-Disposition"] = f'attachment; filename="{half.msg_id}.bin"'
    return response


def _actions_for(state: str) -> list[str]:
    return {"PREPARED": ["commit", "rollback"], "PARKED": ["commit", "rollback", "resume"]}.get(
        state, []
    )


@require_http_methods(["GET", "POST"])
@viewer_required
def transaction_action(
    request: HttpRequest, transaction_id: uuid.UUID, action: str
) -> HttpResponse:
    if not can_act(request.user):
        raise PermissionDenied("Only txhub operators can act on transactions.")
    if action not in operator.ACTIONS:
        return render(request, "console/not_found.html", status=404)
    half = selectors.transaction_get(transaction_id=transaction_id)
    form = ReasonForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        result = operator.operator_act(
            transaction_id=transaction_id,
            action=action,
            username=request.user.get_username(),
            reason=form.cleaned_data["reason"],
        )
        (messages.success if result.ok else messages.warning)(request, result.message)
        return redirect("console:transaction-detail", transaction_id=transaction_id)
    return render(
        request, "console/confirm_action.html", {"half": half, "action": action, "form": form}
    )
