"""The operator console: server-rendered pages over the same selectors and services as the API."""

import base64
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods

from apps.broker import selectors
from apps.broker.services import operator
from apps.broker.services.errors import NotFound
from apps.console import charts
from apps.console.forms import BulkActionForm, ConfirmedReasonForm, TransactionFilterForm
from apps.console.roles import OPERATORS, VIEWERS, can_act, can_view

PREVIEW_BYTES = 4096
CHART_MINUTES = 180


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """The console's not-found page: an unknown transaction, group or token, and any URL under
    /console/ that matches no page (txhub/urls.py's handler404; docs/decisions/0092)."""
    return render(request, "console/not_found.html", status=404)


def forbidden(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """The console's page for a refusal (PermissionDenied under /console/: a viewer's operator
    action, a user in no txhub group; txhub/urls.py's handler403, docs/decisions/0103): why, what
    the user may do instead, and a way back."""
    return _refusal(request, str(exception or ""), about_roles=True)


# What a form the CSRF check refused needs: not a role, a fresh page (docs/decisions/0114).
STALE_FORM = (
    "This form was not sent from a page of this console as it is now (the page is too old, or "
    "its session ended): reload that page and send the form again."
)


def csrf_refused(request: HttpRequest) -> HttpResponse:
    """The console's page for a form the CSRF check refused (errors.csrf_failure, which
    settings.CSRF_FAILURE_VIEW names): what to do, and a way back to the page it came from."""
    return _refusal(request, STALE_FORM, about_roles=False)


def _refusal(request: HttpRequest, reason: str, *, about_roles: bool) -> HttpResponse:
    # A refusal before the authentication middleware ran has no user: signed in as nobody.
    user = getattr(request, "user", None)
    context = {
        "reason": reason,
        "about_roles": about_roles,
        "signed_in": user is not None and user.is_authenticated,
        "may_view": user is not None and can_view(user),
        "operators": OPERATORS,
        "viewers": VIEWERS,
        "back": came_from(request),
    }
    return render(request, "console/forbidden.html", context, status=403)


def came_from(request: HttpRequest) -> str:
    """The console page the user came from (its Referer, when it is a page of this console other
    than this one), else the overview: a link back that needs no script."""
    referer = request.headers.get("Referer", "")
    parts = urlsplit(referer)
    ours = url_has_allowed_host_and_scheme(
        referer, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    if ours and parts.path.startswith("/console/") and parts.path != request.path:
        return f"{parts.path}?{parts.query}" if parts.query else parts.path
    return reverse("console:overview")


def viewer_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @login_required
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not can_view(request.user):
            raise PermissionDenied("You are not in the txhub viewers or operators group.")
        try:
            return view(request, *args, **kwargs)
        except NotFound:
            return not_found(request)

    return wrapped


@viewer_required
def overview(request: HttpRequest) -> HttpResponse:
    per_minute = selectors.resolutions_per_minute(minutes=CHART_MINUTES)
    resolutions = charts.line_chart(
        name="resolutions-per-minute",
        slots=per_minute["slots"],
        series=[
            ("commits", per_minute["commits"], "#1b7f3a"),
            ("rollbacks", per_minute["rollbacks"], "#777777"),
            ("check-back resolutions", per_minute["checkback"], "#2f5fd0"),
        ],
    )
    pending = charts.bar_chart(name="pending-by-age", bars=selectors.pending_by_age())
    return render(
        request,
        "console/overview.html",
        {
            "stats": selectors.console_overview(),
            "resolutions_chart": resolutions,
            "pending_chart": pending,
            "chart_hours": CHART_MINUTES // 60,
        },
    )


@viewer_required
def delayed_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(selectors.delayed_list(), 50).get_page(request.GET.get("page"))
    recalled = selectors.recalled_list()[:50]
    return render(request, "console/delayed.html", {"page": page, "recalled": recalled})


@viewer_required
def transaction_list(request: HttpRequest) -> HttpResponse:
    form = TransactionFilterForm(request.GET or None)
    # A filter that cannot be read lists nothing, never everything; the form shows its error.
    found: Any = []
    if not form.is_bound or form.is_valid():
        filters = form.cleaned_data if form.is_bound else {}
        found = selectors.transaction_search(
            **{k: v for k, v in filters.items() if v not in ("", None)}
        )
    page = Paginator(found, 50).get_page(request.GET.get("page"))
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
    trace = selectors.message_trace(
        msg_id=half.msg_id, producer_groups=None, consumer_groups=None, half=half
    )
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
    form = ConfirmedReasonForm(request.POST or None)
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


@require_http_methods(["POST"])
@viewer_required
def transaction_bulk_action(request: HttpRequest) -> HttpResponse:
    """Commit or roll back the transactions ticked in the list: a reason and a confirmation, then
    each one through the same operator service, in its own database transaction."""
    if not can_act(request.user):
        raise PermissionDenied("Only txhub operators can act on transactions.")
    chosen = BulkActionForm(request.POST)
    if not chosen.is_valid():
        ticked = bool(request.POST.getlist("ids"))
        problem = " ".join(str(e) for e in chosen.errors.get("ids", [])) if ticked else ""
        messages.warning(
            request, problem or "Tick at least one transaction, then choose an action."
        )
        return redirect("console:transactions")
    ids: list[uuid.UUID] = chosen.cleaned_data["ids"]
    action: str = chosen.cleaned_data["action"]
    form = ConfirmedReasonForm(request.POST if "reason" in request.POST else None)
    if not form.is_valid():
        return render(
            request, "console/confirm_bulk.html", {"ids": ids, "action": action, "form": form}
        )
    results = operator.operator_act_many(
        transaction_ids=ids,
        action=action,
        username=request.user.get_username(),
        reason=form.cleaned_data["reason"],
    )
    done = sum(result.ok for result in results)
    messages.success(request, f"{done} of {len(ids)} transactions: {action} done.")
    for transaction_id, result in zip(ids, results, strict=True):
        if not result.ok:
            messages.warning(request, f"{transaction_id}: {result.message}")
    return redirect("console:transactions")


@viewer_required
def audit_list(request: HttpRequest) -> HttpResponse:
    """Who changed tokens, check URLs, secrets, bindings and dead letters (decision 0039): for
    operators only, like the changes themselves."""
    if not can_act(request.user):
        raise PermissionDenied("Only txhub operators can read the audit record.")
    page = Paginator(selectors.audit_records(), 50).get_page(request.GET.get("page"))
    records = [
        {"record": record, "detail": [(k, _shown(v)) for k, v in record.detail.items()]}
        for record in page
    ]
    return render(request, "console/audit.html", {"page": page, "records": records})


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) or "none"
    return str(value) if value != "" else "none"


@viewer_required
def reconciliation_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(
        selectors.reconciliation_runs().annotate(findings_count=Count("findings")), 30
    ).get_page(request.GET.get("page"))
    return render(request, "console/reconciliations.html", {"page": page})


@viewer_required
def reconciliation_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = selectors.reconciliation_get(run_id=run_id)
    return render(
        request,
        "console/reconciliation_detail.html",
        {"run": run, "findings": run.findings.order_by("kind", "id")},
    )
