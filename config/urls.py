from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from runs import health
from runs.api.errors import api_not_found

api_v1 = [
    path("", include("runs.api.urls")),
    path("", include("approvals.api.urls")),
    path("audit/", include("audit.api.urls")),
    path("", include("retention.api.urls")),
    path("", include("webhooks.api.urls")),
    path("schema", SpectacularAPIView.as_view(permission_classes=[]), name="schema"),
    path(
        "docs",
        # The split view serves its start-up script as a file: the CSP allows
        # no inline script. A page, not an API: no OPTIONS, whose metadata
        # answer its HTML renderer has no template for (a 500).
        SpectacularSwaggerSplitView.as_view(
            url_name="schema", permission_classes=[], http_method_names=["get", "head"]
        ),
        name="api-docs",
    ),
]

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    # Anything else under /api/ answers the API's JSON 404, even with DEBUG on.
    re_path(r"^api/", api_not_found),
    # The LangGraph Agent Protocol, for LangGraph's SDKs and UIs.
    path("langgraph/", include("agent_protocol.urls")),
    path("healthz", health.HealthView.as_view(), name="healthz"),
    path("readyz", health.ReadyView.as_view(), name="readyz"),
]

handler400 = "runs.api.errors.bad_request"
handler500 = "runs.api.errors.server_error"
