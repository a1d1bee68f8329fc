from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

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
    path(
        "api/docs/",
        SpectacularSwaggerView.as_view(
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
