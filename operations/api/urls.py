from __future__ import annotations

from django.urls import include, path
from rest_framework.routers import SimpleRouter

from operations.api import releases, resize, rollback, views

router = SimpleRouter()
router.register("operations", views.OperationViewSet, basename="api-operation")

urlpatterns = [
    path("models/<str:name>/gpus/", resize.ResizeView.as_view(), name="api-model-gpus"),
    path("models/<str:name>/context/", resize.ContextView.as_view(), name="api-model-context"),
    path("models/<str:name>/rollback/", rollback.RollbackView.as_view(), name="api-model-rollback"),
    path(
        "models/<str:name>/profiles/<str:profile>/revisions/",
        rollback.RevisionsView.as_view(),
        name="api-profile-revisions",
    ),
    path("models/<str:name>/restart/", views.RestartView.as_view(), name="api-model-restart"),
    path("nodes/<str:name>/cordon/", views.NodeCordonView.as_view(), name="api-node-cordon"),
    path("nodes/<str:name>/uncordon/", views.NodeUncordonView.as_view(), name="api-node-uncordon"),
    path("nodes/<str:name>/drain/", views.NodeDrainView.as_view(), name="api-node-drain"),
    path(
        "nodes/<str:name>/cards/<int:index>/cordon/", views.CardCordonView.as_view(), name="api-card-cordon"
    ),
    path(
        "nodes/<str:name>/cards/<int:index>/uncordon/",
        views.CardUncordonView.as_view(),
        name="api-card-uncordon",
    ),
    path("replicas/<str:name>/move/", views.ReplicaMoveView.as_view(), name="api-replica-move"),
    path("releases/", releases.ReleasesView.as_view(), name="api-releases"),
    path("releases/upgrade/", releases.UpgradeView.as_view(), name="api-releases-upgrade"),
    path(
        "models/<str:name>/profiles/<str:profile>/pin-kv/",
        releases.KvPinView.as_view(),
        name="api-profile-pin-kv",
    ),
    path("", include(router.urls)),
]
