"""The Content-Security-Policy of the console's and the admin's pages and of the API's Swagger UI
(docs/decisions/0092).

Tenants' strings are escaped where a page shows them; the policy is the second wall: should one
ever reach a page as markup, no inline script, event handler or `javascript:` URL in it runs, no
plugin loads, no <base> redirects the page's links, no form posts to another site, and no other
site frames the page (what X-Frame-Options DENY says to older browsers). Inline styles stay
allowed: the console's stylesheet is inline on purpose (no CDN) and a style cannot run script."""

from django.http import HttpRequest, HttpResponse
from django.utils.deprecation import MiddlewareMixin

POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
# The pages the policy covers. The API answers JSON; its Swagger UI (drf-spectacular's split view,
# whose start-up script is a file, not inline) is a page like the console's.
COVERED_PREFIXES = ("/console/", "/admin/", "/api/docs/")


class ContentSecurityPolicyMiddleware(MiddlewareMixin):
    """The policy on the console's, the admin's and the Swagger UI's pages (Django's own
    middleware, before this one, sends X-Frame-Options DENY on every response, as `check
    --deploy` asks)."""

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        if request.path.startswith(COVERED_PREFIXES):
            response.headers.setdefault("Content-Security-Policy", POLICY)
        return response
