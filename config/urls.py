from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from runs import health
from runs.api.errors import api_not_found

api_v1 = [
    path("", include("runs.api.urls")),
    path("schema", SpectacularAPIView.as_view(permission_classes=[]), name="schema"),
    path(
        "docs",
        SpectacularSwaggerView.as_view(url_name="schema", permission_classes=[]),
        name="api-docs",
    ),
]

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    # Anything else under /api/ answers the API's JSON 404, even with DEBUG on.
    re_path(r"^api/", api_not_found),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
]

handler500 = "runs.api.errors.server_error"
