"""Every API error in the contract's one format:
{"error": {"code": "<snake_case>", "message": "<human sentence>", "details": {...}}}"""

import logging
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response

from apps.broker.services.errors import BrokerError

logger = logging.getLogger(__name__)

CODES = {
    400: "invalid_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    409: "conflict",
    413: "payload_too_large",
    429: "throttled",
    503: "unavailable",
}


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def _first_message(detail: Any) -> str:
    """The first human sentence inside DRF's nested error details."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            inner = _first_message(value)
            return inner if key == "non_field_errors" else f"{key}: {inner}"
    if isinstance(detail, list) and detail:
        return _first_message(detail[0])
    return str(detail)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, BrokerError):
        return Response(error_body(exc.code, exc.message, exc.details), status=exc.status)
    if isinstance(exc, RequestDataTooBig):
        message = "The request body is too large: a message body has at most 4 MiB."
        return Response(error_body("payload_too_large", message), status=413)
    if isinstance(exc, Http404):
        return Response(error_body("not_found", "Not found."), status=404)
    if isinstance(exc, (OperationalError, InterfaceError)):
        logger.exception("database unavailable")
        return Response(
            error_body("unavailable", "The database is unavailable; try again."), status=503
        )
    if isinstance(exc, exceptions.APIException):
        return _api_exception(exc)
    if isinstance(exc, DatabaseError):
        logger.exception("database error")
    return None  # anything else is a bug: Django's 500 handler answers in our format


def _api_exception(exc: exceptions.APIException) -> Response:
    code = CODES.get(exc.status_code, "invalid_request")
    details: dict[str, Any] = {}
    if isinstance(exc, exceptions.ValidationError):
        message = _first_message(exc.detail)
        details = exc.detail if isinstance(exc.detail, dict) else {"errors": exc.detail}
    elif isinstance(exc, exceptions.Throttled):
        message = str(exc.detail)
        details = {"retry_after": getattr(exc, "wait", None)}
    else:
        message = str(exc.detail)
    if isinstance(exc, exceptions.ParseError):
        message = f"The body is not valid JSON: {exc.detail}"
    headers = {}
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        code, exc.status_code = "unauthenticated", 401
        headers["WWW-Authenticate"] = 'Bearer realm="txhub"'
    return Response(error_body(code, message, details), status=exc.status_code, headers=headers)


def handler404(request: HttpRequest, exception: Exception | None = None) -> Any:
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("not_found", "No such API endpoint."), status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception or Http404())


def handler500(request: HttpRequest) -> Any:
    if request.path.startswith("/api/"):
        return JsonResponse(
            error_body("internal_error", "Something went wrong on our side; it is logged."),
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )
    from django.views.defaults import server_error

    return server_error(request)
