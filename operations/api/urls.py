from __future__ import annotations

from django.urls import include, path
from rest_framework.routers import SimpleRouter

from operations.api import views

router = SimpleRouter()
router.register("operations", views.OperationViewSet, basename="api-operation")

urlpatterns = [
    path("models/<str:name>/restart/", views.RestartView.as_view(), name="api-model-restart"),
    path("", include(router.urls)),
]
