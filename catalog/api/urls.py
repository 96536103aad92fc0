from __future__ import annotations

from django.urls import include, path
from rest_framework.routers import DefaultRouter

from catalog.api import resize, rollback, views, whoami

router = DefaultRouter()
router.register("gpu-classes", views.GPUClassViewSet, basename="api-gpuclass")
router.register("nodes", views.NodeViewSet, basename="api-node")
router.register("models", views.ServedModelViewSet, basename="api-model")
router.register("profiles", views.ProfileViewSet, basename="api-profile")
router.register("replicas", views.ReplicaViewSet, basename="api-replica")

urlpatterns = [
    path("whoami/", whoami.WhoAmIView.as_view(), name="api-whoami"),
    path("models/<str:name>/gpus/", resize.ResizeView.as_view(), name="api-model-gpus"),
    path("models/<str:name>/context/", resize.ContextView.as_view(), name="api-model-context"),
    path("models/<str:name>/rollback/", rollback.RollbackView.as_view(), name="api-model-rollback"),
    path(
        "models/<str:name>/profiles/<str:profile>/revisions/",
        rollback.RevisionsView.as_view(),
        name="api-profile-revisions",
    ),
    path("", include(router.urls)),
]
