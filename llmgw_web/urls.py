from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from llmgw_web.api_docs import SchemaView, SwaggerView
from web.views.metrics import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics, name="metrics"),  # Prometheus' default path
    path("api/schema/", SchemaView.as_view(), name="schema"),
    path("api/docs/", SwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/", include("audit.api.urls")),
    path("api/", include("operations.api.urls")),
    path("api/", include("catalog.api.urls")),
    path("audit/", include("audit.urls")),
    path("", include("access.urls")),
    path("", include("operations.urls")),
    path("", include("web.urls")),
]

handler404 = "llmgw_web.errors.not_found"
