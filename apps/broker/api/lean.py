"""The lean door: the hot API calls answered without Django's request cycle (decision 0027).

A prepare costs ~2 ms of web CPU through the full stack, of which the view itself (validation,
the service, its SQL, the rendering) is a third. The rest is frame: Django's request object and
its META, nine middleware (sessions, CSRF, messages, axes: none of which an API call with a
bearer token uses), URL resolution, DRF's Request wrapper and content negotiation, the response's
rendering pass and the thread hop of asgiref. For the hot calls (prepare, commit, rollback, send,
receive, ack and their batches) this module keeps the parts that serve the contract and drops the
frame:

- The **same view method** answers (TransactionListView.post, ...): the same validation
  (the DRF serializers), scope checks, services and output. There is no second copy of a rule.
- The **same authenticator, permission and throttle classes** as DRF's `initial()` runs, in its
  order (401 -> 403 -> 429, then the view's 400 -> 403 -> 404), and the **same exception
  handler** renders every error in the contract's format.
- The **same response headers**: DRF's `Allow`, and what SecurityMiddleware and
  XFrameOptionsMiddleware add to every answer (tests/broker/test_lean_door.py compares the two
  doors' answers, headers included, for each route).

Only a plain request comes in: POST to one of the routes, no query string, a Host Django allows,
a bearer token, no cookie, a JSON object body of at most LARGE_BODY_BYTES with its
Content-Length and `application/json` (or no body), an Accept that takes JSON, no repeated
header. Everything else (and every request when DEBUG or a proxy's Host or port headers are
trusted) is answered by Django, as before: `take()` returns None, having done nothing. The
decision is made before anything is counted or stored, so a request is answered by exactly one
door.

The production settings (docs/operations.md) are served here too (decision 0027), so what the
benchmarks and the parity tests measure is production's path: a request is secure as Django's
`is_secure()` reads it (the scheme, or `SECURE_PROXY_SSL_HEADER`); with `SECURE_SSL_REDIRECT` an
insecure one is Django's (its redirect); a secure answer carries the HSTS header
SecurityMiddleware would add.
"""

import functools
import io
import logging
from dataclasses import dataclass, field
from typing import Any, cast

from django.conf import settings
from django.db import connections
from django.http.request import split_domain_port, validate_host
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils.datastructures import CaseInsensitiveMapping
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.broker import metrics
from apps.broker.api import auth, batch_views, long_poll, views
from apps.broker.api import urls as api_urls
from apps.broker.api.errors import exception_handler, internal_error_body
from apps.broker.api.parsers import LimitedJSONParser
from apps.broker.services.consuming import WaitPlan
from apps.broker.services.errors import BrokerError

# Where Django logs a request's unhandled exception (its 500s): the same logger for both doors.
_request_logger = logging.getLogger("django.request")

# The hot calls the lean door answers; their routes are api/urls.py's, found there once.
HOT_VIEWS: tuple[type[APIView], ...] = (
    views.TransactionListView,
    batch_views.PrepareBatchView,
    batch_views.CommitBatchView,
    batch_views.RollbackBatchView,
    views.TransactionCommitView,
    views.TransactionRollbackView,
    views.TopicMessagesView,
    batch_views.SendBatchView,
    views.ReceiveView,
    views.AckView,
)


@dataclass(frozen=True)
class Route:
    pattern: URLPattern  # api/urls.py's own: its converters turn the path's parts into kwargs
    view: type[APIView]
    allow: bytes  # DRF's Allow header for the view


def _allow(view_class: type[APIView]) -> bytes:
    """DRF's Allow header for the view: its methods, with the HEAD that View.setup() adds."""
    view = view_class()
    if hasattr(view, "get") and not hasattr(view, "head"):
        view.head = view.get  # type: ignore[attr-defined]
    return ", ".join(view.allowed_methods).encode()


@functools.cache
def _routes() -> tuple[str, tuple[Route, ...]]:
    """The API's prefix in the root URLconf and the hot views' routes, from the URL tables
    themselves (read once, at the first request, when the URLconf is importable)."""
    prefix = next(
        "/" + str(entry.pattern)
        for entry in get_resolver().url_patterns
        if isinstance(entry, URLResolver)
        and getattr(entry.urlconf_module, "__name__", "") == api_urls.__name__
    )
    routes = tuple(
        Route(entry, entry.callback.view_class, _allow(entry.callback.view_class))  # type: ignore[attr-defined]
        for entry in api_urls.urlpatterns
        if isinstance(entry, URLPattern)
        and getattr(entry.callback, "view_class", None) in HOT_VIEWS
    )
    return prefix, routes


_JSON_TYPES = frozenset({b"application/json", b"application/json; charset=utf-8"})
_ACCEPTS_JSON = frozenset({b"*/*", b"application/json", b"application/*"})


@dataclass
class Answer:
    """What the lean door answers: status, JSON body, headers; a receive that found nothing and
    may wait carries its plan (the ASGI handler waits, as for Django's answer)."""

    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]]
    plan: WaitPlan | None = None


@dataclass
class LeanRequest:
    """What the views, the authenticator and the throttle read of a request, and nothing more
    (a duck of rest_framework.request.Request for these views)."""

    method: str
    path: str
    META: dict[str, Any]
    headers: CaseInsensitiveMapping[str]
    data: dict[str, Any]
    user: Any = None
    auth: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Call:
    """A request the lean door takes: decided on the event loop, answered in a thread."""

    route: Route
    kwargs: dict[str, Any]
    request: LeanRequest
    secure: bool = False  # as Django's request.is_secure() would read it


def enabled() -> bool:
    """Off when a setting makes Django answer differently than the lean door can (DEBUG's
    technical pages, a Host or port taken from a proxy's headers), or by TXHUB_LEAN_DOOR=0."""
    return bool(
        getattr(settings, "TXHUB_LEAN_DOOR", True)
        and not settings.DEBUG  # Django's technical pages, not the contract's JSON
        and not settings.USE_X_FORWARDED_HOST
        and not settings.USE_X_FORWARDED_PORT
    )


def take(scope: dict[str, Any], body: bytes) -> Call | None:
    """The call, if this request is one the lean door answers; None: Django answers it. Reads
    nothing but the request (no I/O)."""
    if scope.get("method") != "POST" or scope.get("query_string") or scope.get("root_path"):
        return None
    scheme = scope.get("scheme", "http")
    if scheme not in ("http", "https"):
        return None
    path: str = scope.get("path", "")
    prefix, routes = _routes()
    if not path.startswith(prefix):
        return None
    for route in routes:
        match = route.pattern.resolve(path[len(prefix) :])
        if match is not None:
            break
    else:
        return None
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1").lower()
        if name in headers or "_" in name:
            # A repeated header: Django joins some, keeps others. An underscore: Django's META
            # drops the header (it could pass for its dashed twin, `x_forwarded_proto`). Either
            # way, Django decides, so the two doors never read a request differently.
            return None
        headers[name] = raw_value.decode("latin-1")
    if not _plain_headers(headers, len(body)):
        return None
    secure = _is_secure(scheme, headers)
    if settings.SECURE_SSL_REDIRECT and not secure:
        return None  # SecurityMiddleware's redirect to https (no API path is exempt)
    data = _parsed(body)
    if data is None:
        return None
    meta: dict[str, Any] = {
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_AUTHORIZATION": headers["authorization"],
        # As Django's request has it: the authenticator counts failures per address (0038).
        "REMOTE_ADDR": auth.client_address(scope),
        long_poll.WAIT_OUTSIDE: True,
    }
    request = LeanRequest(
        method="POST",
        path=path,
        META=meta,
        headers=CaseInsensitiveMapping(headers),
        data=data,
    )
    return Call(route, dict(match.kwargs), request, secure)


def _is_secure(scheme: str, headers: dict[str, str]) -> bool:
    """Django's HttpRequest.scheme: the proxy's header when it is configured and present (its
    first comma-separated value), else the connection's own scheme."""
    if settings.SECURE_PROXY_SSL_HEADER is not None:
        meta_name, secure_value = settings.SECURE_PROXY_SSL_HEADER
        name = meta_name.removeprefix("HTTP_").lower().replace("_", "-")
        value = headers.get(name) if meta_name.startswith("HTTP_") else None
        if value is not None:
            return value.split(",", 1)[0].strip() == secure_value
    return scheme == "https"


def _plain_headers(headers: dict[str, str], body_length: int) -> bool:
    if not headers.get("authorization", "").lower().startswith("bearer "):
        return False
    host = headers.get("host")
    if host is None or not _host_allowed(host):
        return False
    if body_length > views.LARGE_BODY_BYTES:
        return False  # the large-body pre-check and limits: Django's
    if "cookie" in headers:
        return False  # sessions and CSRF may answer with cookies of their own: Django's part
    declared = headers.get("content-length")
    if declared != str(body_length) and (declared is not None or body_length):
        return False  # DRF reads a body by its declared length: one without it is Django's
    if "transfer-encoding" in headers:
        return False
    content_type = headers.get("content-type")
    if body_length and (content_type is None or content_type.lower().encode() not in _JSON_TYPES):
        return False
    accept = headers.get("accept")
    return accept is None or accept.strip().encode() in _ACCEPTS_JSON


def _host_allowed(host: str) -> bool:
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    domain, _ = split_domain_port(host)
    return bool(domain) and validate_host(domain, allowed)


_parser = LimitedJSONParser()


def _parsed(body: bytes) -> dict[str, Any] | None:
    """The body as DRF's parser reads it (strict JSON: no NaN), or None for anything it would
    refuse (Django then answers, with DRF's own message)."""
    if not body:
        return {}
    try:
        data = _parser.parse(io.BytesIO(body), "application/json", None)
    except (exceptions.ParseError, BrokerError, ValueError):  # BrokerError: a repeated key
        return None
    return cast(dict[str, Any], data)


_renderer = JSONRenderer()


def answer(call: Call) -> Answer:
    """DRF's `initial()` (authenticate, permissions, throttles), then the view's method, then its
    answer rendered; any exception through the API's exception handler. In a worker thread: the
    database connection goes back to the pool at the end."""
    request = call.request
    view = call.route.view()
    try:
        try:
            response = _dispatch(view, request, call.kwargs)
        except Exception as error:  # noqa: BLE001 - answered in the contract's format, as DRF
            handled = exception_handler(error, {})
            if handled is None:
                raise
            response = handled
        body = _renderer.render(response.data) if response.data is not None else b""
    except Exception:  # noqa: BLE001 - a bug: Django's 500 handler answers this way for the API
        _request_logger.exception("Internal Server Error: %s", request.path)
        rendered = _renderer.render(internal_error_body())
        metrics.LEAN_ANSWERS.labels(call.route.view.__name__).inc()
        # As handler500's answer: no Allow (DRF re-raised before finalize_response).
        return Answer(500, rendered, _headers(None, [], rendered, call.secure))
    finally:
        connections.close_all()
    extra = [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in response.items()
        if name.lower() != "content-type"
    ]
    result = Answer(response.status_code, body, _headers(call.route, extra, body, call.secure))
    metrics.LEAN_ANSWERS.labels(call.route.view.__name__).inc()
    result.plan = long_poll.plan_of(response)
    return result


def _dispatch(view: APIView, request: LeanRequest, kwargs: dict[str, Any]) -> Response:
    drf_request = cast(Request, request)
    user_auth = None
    for authenticator in view.get_authenticators():
        user_auth = authenticator.authenticate(drf_request)
        if user_auth is not None:
            break
    if user_auth is None:
        raise exceptions.NotAuthenticated()
    request.user, request.auth = user_auth
    for permission in view.get_permissions():
        if not permission.has_permission(drf_request, view):
            raise exceptions.PermissionDenied(getattr(permission, "message", None))
    waits = []
    for throttle in view.get_throttles():
        if not throttle.allow_request(drf_request, view):
            waits.append(throttle.wait())
    if waits:
        raise exceptions.Throttled(max((w for w in waits if w is not None), default=None))
    response: Response = view.post(drf_request, **kwargs)  # type: ignore[attr-defined]
    return response


def _headers(
    route: Route | None, extra: list[tuple[bytes, bytes]], body: bytes, secure: bool
) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-type", b"application/json"),
        *extra,
        *([(b"allow", route.allow)] if route is not None else []),
        (b"content-length", str(len(body)).encode()),
        *middleware_headers(secure=secure),
    ]


def middleware_headers(*, secure: bool) -> list[tuple[bytes, bytes]]:
    """What SecurityMiddleware and XFrameOptionsMiddleware add to an API answer."""
    headers = [(b"x-frame-options", getattr(settings, "X_FRAME_OPTIONS", "DENY").upper().encode())]
    if secure and settings.SECURE_HSTS_SECONDS:
        hsts = f"max-age={settings.SECURE_HSTS_SECONDS}"
        if settings.SECURE_HSTS_INCLUDE_SUBDOMAINS:
            hsts += "; includeSubDomains"
        if settings.SECURE_HSTS_PRELOAD:
            hsts += "; preload"
        headers.append((b"strict-transport-security", hsts.encode()))
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers.append((b"x-content-type-options", b"nosniff"))
    if settings.SECURE_REFERRER_POLICY:
        policy = settings.SECURE_REFERRER_POLICY
        value = policy if isinstance(policy, str) else ",".join(policy)
        headers.append((b"referrer-policy", value.encode()))
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        headers.append(
            (b"cross-origin-opener-policy", settings.SECURE_CROSS_ORIGIN_OPENER_POLICY.encode())
        )
    return headers
