"""The console while the database is unreachable (no primary during a failover, Postgres down):
a page that says so and reloads itself, with 503, instead of Django's server error page
(CONTRACT 7, docs/decisions/0042). The API answers 503 `unavailable` in its own format. Only an
unreachable database is that: a query that failed is the server error page, which does not
reload itself forever (services/errors.database_unreachable, docs/decisions/0078)."""

import logging
from collections.abc import Callable

from django.db import DatabaseError, InterfaceError
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string

from apps.broker.services.errors import database_unreachable_here

logger = logging.getLogger(__name__)

RETRY_SECONDS = 5


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not request.path.startswith("/console/"):
            return None
        # Asked in the thread whose query failed: Django calls this in the view's thread.
        database = isinstance(exception, DatabaseError | InterfaceError)
        if not database or not database_unreachable_here(exception):
            return None
        logger.warning("console %s: the database is unavailable: %s", request.path, exception)
        # Rendered without the request: the context processors would ask the database again.
        page = render_to_string("console/unavailable.html", {"retry": RETRY_SECONDS})
        response = HttpResponse(page, status=503)
        response["Retry-After"] = str(RETRY_SECONDS)
        return response
