from __future__ import annotations

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from catalog.api import operations, restart, views, whoami

router = DefaultRouter()
router.register("gpu-classes", views.GPUClassViewSet, basename="api-gpuclass")
router.register("nodes", views.NodeViewSet, basename="api-node")
router.register("models", views.ServedModelViewSet, basename="api-model")
router.register("profiles", views.ProfileViewSet, basename="api-profile")
router.register("replicas", views.ReplicaViewSet, basename="api-replica")
router.register("operations", restart.OperationViewSet, basename="api-operation")

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("whoami/", whoami.WhoAmIView.as_view(), name="api-whoami"),
    path("models/<str:name>/gpus/", operations.ResizeView.as_view(), name="api-model-gpus"),
    path("models/<str:name>/context/", operations.ContextView.as_view(), name="api-model-context"),
    path("models/<str:name>/restart/", restart.RestartView.as_view(), name="api-model-restart"),
    path("", include(router.urls)),
]
