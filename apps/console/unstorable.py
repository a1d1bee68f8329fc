"""Query strings Postgres cannot store (NUL characters, lone surrogates) are refused with 400 on
the console's and the admin's pages, before a filter built from one reaches a query and fails
there as a 500 (CONTRACT invariant 9). The rule is the API's own, limits.check_text; the API
checks its inputs itself and answers in its own format, so its paths are left to it."""

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest

from apps.broker import limits


class UnstorableQueryMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith("/api/"):
            for key, values in request.GET.lists():
                for text in (key, *values):
                    try:
                        limits.check_text(text)
                    except limits.LimitError as error:
                        return HttpResponseBadRequest(
                            f"Bad query parameter: {error}", content_type="text/plain"
                        )
        return self.get_response(request)
