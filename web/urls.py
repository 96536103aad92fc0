from __future__ import annotations

from django.urls import path

from web.views import models, nodes, profiles, releases, replicas

urlpatterns = [
    # The operator pages; the models list is home.
    path("", models.model_list, name="model-list"),
    path("models/<str:name>/", models.model_detail, name="model-detail"),
    path("models/<str:name>/replicas/", models.model_replicas, name="model-replicas"),
    path("models/<str:name>/resize/preview/", models.resize_preview, name="model-resize-preview"),
    path("models/<str:name>/resize/", models.resize_apply, name="model-resize"),
    path("models/<str:name>/context/preview/", models.context_preview, name="model-context-preview"),
    path("models/<str:name>/context/", models.context_apply, name="model-context"),
    path(
        "models/<str:name>/profiles/<str:profile>/revisions/",
        profiles.profile_revisions,
        name="profile-revisions",
    ),
    path(
        "models/<str:name>/profiles/<str:profile>/rollback/",
        profiles.profile_rollback_apply,
        name="profile-rollback",
    ),
    path("models/<str:name>/profiles/<str:profile>/pin-kv/", models.profile_pin_kv, name="profile-pin-kv"),
    path("replicas/<str:name>/", replicas.replica_detail, name="replica-detail"),
    path("replicas/<str:name>/log/", replicas.replica_log, name="replica-log"),
    path("replicas/<str:name>/log.txt", replicas.replica_log_download, name="replica-log-download"),
    path("releases/", releases.release_list, name="release-list"),
    path("releases/upgrade/", releases.release_upgrade, name="release-upgrade"),
    path("nodes/", nodes.node_list, name="node-list"),
    path("nodes/<str:name>/", nodes.node_detail, name="node-detail"),
]
