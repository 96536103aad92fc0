from __future__ import annotations

from django.urls import path

from operations import views

urlpatterns = [
    path("models/<str:name>/restart/", views.model_restart, name="model-restart"),
    path("nodes/<str:name>/cordon/", views.node_cordon, name="node-cordon"),
    path("nodes/<str:name>/uncordon/", views.node_uncordon, name="node-uncordon"),
    path("nodes/<str:name>/drain/", views.node_drain, name="node-drain"),
    path("nodes/<str:name>/drain/preview/", views.node_drain_preview, name="node-drain-preview"),
    path("nodes/<str:name>/cards/cordon/", views.card_cordon, name="card-cordon"),
    path("nodes/<str:name>/cards/<int:index>/uncordon/", views.card_uncordon, name="card-uncordon"),
    path("replicas/<str:name>/move/", views.replica_move, name="replica-move"),
    path("replicas/<str:name>/move/preview/", views.replica_move_preview, name="replica-move-preview"),
    path("operations/", views.operation_list, name="operation-list"),
    path("operations/<int:pk>/", views.operation_detail, name="operation-detail"),
    path("operations/<int:pk>/cancel/", views.operation_cancel, name="operation-cancel"),
]
