from __future__ import annotations

from django.urls import include, path
from rest_framework import routers
from rest_framework.routers import DefaultRouter

from base.rules import SIGNED_IN, Rule
from catalog.api import views, whoami


class APIRootView(routers.APIRootView):
    """The API's index of endpoints: any signed-in user may read the list."""

    required_permission: Rule = SIGNED_IN


router = DefaultRouter()
router.APIRootView = APIRootView
router.register("gpu-classes", views.GPUClassViewSet, basename="api-gpuclass")
router.register("nodes", views.NodeViewSet, basename="api-node")
router.register("models", views.ServedModelViewSet, basename="api-model")
router.register("profiles", views.ProfileViewSet, basename="api-profile")
router.register("replicas", views.ReplicaViewSet, basename="api-replica")

urlpatterns = [
    path("whoami/", whoami.WhoAmIView.as_view(), name="api-whoami"),
    path("", include(router.urls)),
]
