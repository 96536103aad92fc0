from __future__ import annotations

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from catalog.api import operations, views

router = DefaultRouter()
router.register("gpu-classes", views.GPUClassViewSet, basename="gpuclass")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("models", views.ServedModelViewSet, basename="model")
router.register("profiles", views.ProfileViewSet, basename="profile")
router.register("replicas", views.ReplicaViewSet, basename="replica")

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("models/<str:name>/gpus/", operations.ResizeView.as_view(), name="model-gpus"),
    path("models/<str:name>/context/", operations.ContextView.as_view(), name="model-context"),
    path("", include(router.urls)),
]
