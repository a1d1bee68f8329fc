from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from txhub import health

urlpatterns = [
    path("healthz", health.healthz),
    path("readyz", health.readyz),
    path("metrics", health.metrics),
    path("api/v1/", include("apps.broker.api.urls")),
    path(
        "api/schema/",
        SpectacularAPIView.as_view(permission_classes=[], authentication_classes=[]),
        name="schema",
    ),
    # Its start-up script is served as a file of its own (?script), not inline, so the page
    # works under the console's Content-Security-Policy (docs/decisions/0092).
    path(
        "api/docs/",
        SpectacularSwaggerSplitView.as_view(
            url_name="schema", permission_classes=[], authentication_classes=[]
        ),
        name="api-docs",
    ),
    path("admin/", admin.site.urls),
    path("console/", include("apps.console.urls")),
]

handler400 = "apps.broker.api.errors.handler400"
handler403 = "apps.broker.api.errors.handler403"
handler404 = "apps.broker.api.errors.handler404"
handler500 = "apps.broker.api.errors.handler500"
