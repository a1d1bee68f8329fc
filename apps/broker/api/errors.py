"""Every API error in the contract's one format:
{"error": {"code": "<snake_case>", "message": "<human sentence>", "details": {...}}}"""

import json
import logging
import math
from itertools import islice
from typing import Any

from django.core.exceptions import (
    DisallowedHost,
    RequestDataTooBig,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.db import DatabaseError, InterfaceError
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions, status
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from apps.broker.services.errors import BrokerError, Throttled, database_unreachable_here

logger = logging.getLogger(__name__)

# One code per status. The contract's own list, and for the statuses it is silent on the codes
# DRF itself names them by (405, 406, 415) and the web server's read limits (408, 431), so that
# invalid_request always means 400 (docs/api.md "Errors").
CODES = {
    400: "invalid_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "request_timeout",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "throttled",
    431: "headers_too_large",
    500: "internal_error",
    503: "unavailable",
}


# Every 503 at every door says when to try again (docs/decisions/0086): its causes (no database,
# Redis away for a configuration change, a process's connections or pipeline full) pass within
# seconds, and the SDK waits at least this before its retry.
UNAVAILABLE_RETRY_SECONDS = 1


def unavailable_headers() -> dict[str, str]:
    """The headers of every 503 `unavailable`, whichever door sends it (decision 0086)."""
    return {"Retry-After": str(UNAVAILABLE_RETRY_SECONDS)}


# What one error answer may carry: a few names, short sentences, a few KiB in all. Input is
# echoed in details (a field name, a choice that was refused); a hostile body must not turn
# into a 33 MB answer, and a lone surrogate in it must not make the answer unencodable.
MAX_ERROR_ITEMS = 10
MAX_ERROR_CHARS = 300
MAX_ERROR_DEPTH = 3
MAX_ERROR_BYTES = 4096


def _text(value: str) -> str:
    if len(value) > MAX_ERROR_CHARS:
        value = value[:MAX_ERROR_CHARS] + "..."
    # A lone surrogate cannot be encoded as UTF-8: shown as its escape instead.
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _bounded(value: Any, depth: int = 0) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return _text(value)
    if depth >= MAX_ERROR_DEPTH:
        return "..."
    if isinstance(value, dict):
        out = {
            _text(str(key)): _bounded(item, depth + 1)
            for key, item in islice(value.items(), MAX_ERROR_ITEMS)
        }
        if len(value) > MAX_ERROR_ITEMS:
            out["..."] = f"{len(value) - MAX_ERROR_ITEMS} more"
        return out
    if isinstance(value, list | tuple):
        items = [_bounded(item, depth + 1) for item in value[:MAX_ERROR_ITEMS]]
        if len(value) > MAX_ERROR_ITEMS:
            items.append(f"... {len(value) - MAX_ERROR_ITEMS} more")
        return items
    return _text(str(value))


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """The contract's error envelope, bounded (MAX_ERROR_BYTES) and always encodable."""
    bounded = _bounded(details or {})
    if len(json.dumps(bounded)) > MAX_ERROR_BYTES:
        bounded = {"truncated": True}
    return {"error": {"code": code, "message": _text(str(message)), "details": bounded}}


def _first_message(detail: Any) -> str:
    """The first human sentence inside DRF's nested error details."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            inner = _first_message(value)
            return inner if key == "non_field_errors" else f"{key}: {inner}"
    if isinstance(detail, list) and detail:
        return _first_message(detail[0])
    return str(detail)


def internal_error_body() -> dict[str, Any]:
    """The contract's 500: no SQL, no trace (what happened is logged)."""
    return error_body(CODES[500], "Something went wrong on our side; it is logged.")


def rendered_error(error: Exception) -> tuple[int, bytes, dict[str, str]] | None:
    """An error met outside DRF's request cycle, answered by the one exception handler below:
    (status, JSON body, headers but its content type), or None for a bug (the caller's 500)."""
    handled = exception_handler(error, {})
    if handled is None:
        return None
    headers = {name: value for name, value in handled.items() if name.lower() != "content-type"}
    return handled.status_code, JSONRenderer().render(handled.data), headers


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, BrokerError):
        headers = None
        if isinstance(exc, Throttled):
            headers = {"Retry-After": str(exc.retry_after)}
        elif exc.status == 503:
            headers = unavailable_headers()
        body = error_body(exc.code, exc.message, exc.details)
        return Response(body, status=exc.status, headers=headers)
    if isinstance(exc, RequestDataTooBig):
        message = "The request body is too large: a message body has at most 4 MiB."
        return Response(error_body("payload_too_large", message), status=413)
    if isinstance(exc, Http404):
        return Response(error_body("not_found", "Not found."), status=404)
    if isinstance(exc, exceptions.APIException):
        return _api_exception(exc)
    if isinstance(exc, DatabaseError | InterfaceError):
        # Asked in the thread whose query failed (every caller of this handler is): only an
        # unreachable database is 503, which clients retry; a query that failed (a statement
        # timeout, a deadlock) is a 500 (docs/decisions/0078).
        if database_unreachable_here(exc):
            logger.exception("database unavailable")
            return Response(
                error_body("unavailable", "The database is unavailable; try again."),
                status=503,
                headers=unavailable_headers(),
            )
        logger.exception("database error")
    return None  # anything else is a bug: Django's 500 handler answers in our format


def retry_after_seconds(wait: float | None) -> int:
    """Retry-After for a throttled answer, at every door: whole seconds rounded up, at least 1
    (RFC 9110 delay-seconds; a client that waits what it is told is not refused again)."""
    return max(1, math.ceil(wait or 1))


def _api_exception(exc: exceptions.APIException) -> Response:
    code = CODES.get(exc.status_code, "invalid_request")
    details: dict[str, Any] = {}
    if isinstance(exc, exceptions.ValidationError):
        message = _first_message(exc.detail)
        details = exc.detail if isinstance(exc.detail, dict) else {"errors": exc.detail}
    elif isinstance(exc, exceptions.Throttled):
        message = str(exc.detail)
    else:
        message = str(exc.detail)
    headers = {}
    if isinstance(exc, exceptions.Throttled):
        retry_after = retry_after_seconds(getattr(exc, "wait", None))
        details = {"retry_after": retry_after}
        headers["Retry-After"] = str(retry_after)
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        code, exc.status_code = "unauthenticated", 401
        headers["WWW-Authenticate"] = 'Bearer realm="txhub"'
    return Response(error_body(code, message, details), status=exc.status_code, headers=headers)


def _suspicious(exception: Exception) -> tuple[int, str]:
    """Status and message for a request Django refused before any view (SuspiciousOperation:
    handler400), without echoing what was refused (a Host header, a parameter)."""
    if isinstance(exception, DisallowedHost):
        return 400, "The Host header names a host this server does not answer for."
    if isinstance(exception, TooManyFieldsSent | TooManyFilesSent):
        return 400, "The request has too many parameters."
    if isinstance(exception, RequestDataTooBig):
        return 413, "The request body is too large: a message body has at most 4 MiB."
    return 400, "The request is malformed."


API, CONSOLE, OTHER = "api", "console", "other"


def door_of(request: HttpRequest) -> str:
    """Whose pages answer an error of `request`, decided here only, by its path: the API's in the
    contract's JSON, the console's (HTML, with its navigation; docs/decisions/0092 and 0103),
    anything else (the admin among them) Django's."""
    if request.path.startswith("/api/"):
        return API
    if request.path.startswith("/console/"):
        return CONSOLE
    return OTHER


def handler400(request: HttpRequest, exception: Exception) -> Any:
    if door_of(request) == API:
        status_code, message = _suspicious(exception)
        return JsonResponse(error_body(CODES[status_code], message), status=status_code)
    from django.views.defaults import bad_request

    return bad_request(request, exception)


def handler403(request: HttpRequest, exception: Exception) -> Any:
    """A refusal (PermissionDenied), answered as its door answers: the API in the contract's JSON,
    the console with its own page saying what the user may do (docs/decisions/0103)."""
    door = door_of(request)
    if door == API:
        message = "You do not have permission to perform this action."
        return JsonResponse(error_body("forbidden", message), status=403)
    if door == CONSOLE:
        from apps.console.views import forbidden

        return forbidden(request, exception)
    from django.views.defaults import permission_denied

    return permission_denied(request, exception)


def csrf_failure(request: HttpRequest, reason: str = "") -> Any:
    """A request the CSRF check refused (settings.CSRF_FAILURE_VIEW), answered as its door
    answers (docs/decisions/0114): the API in the contract's JSON, the console with its own page
    saying what to do, anything else (the admin) Django's page. `reason` is Django's, for its
    page only: it may echo a request's Origin or Referer."""
    door = door_of(request)
    if door == API:
        message = "The request failed its CSRF check."
        return JsonResponse(error_body("forbidden", message), status=403)
    if door == CONSOLE:
        from apps.console.views import csrf_refused

        return csrf_refused(request)
    from django.views.csrf import csrf_failure as django_csrf_failure

    return django_csrf_failure(request, reason)


def handler404(request: HttpRequest, exception: Exception | None = None) -> Any:
    """A URL that matches no pattern, answered as its door answers: the API in the contract's
    JSON, the console with its own page (docs/decisions/0092), anything else Django's page."""
    door = door_of(request)
    if door == API:
        return JsonResponse(error_body("not_found", "No such API endpoint."), status=404)
    if door == CONSOLE:
        from apps.console.views import not_found

        return not_found(request, exception)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception or Http404())


def handler500(request: HttpRequest) -> Any:
    if door_of(request) == API:
        return JsonResponse(
            internal_error_body(),
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )
    from django.views.defaults import server_error

    return server_error(request)
