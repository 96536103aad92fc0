from __future__ import annotations

from django.urls import path

from operations import views

urlpatterns = [
    path("models/<str:name>/restart/", views.model_restart, name="model-restart"),
    path("operations/", views.operation_list, name="operation-list"),
    path("operations/<int:pk>/", views.operation_detail, name="operation-detail"),
    path("operations/<int:pk>/cancel/", views.operation_cancel, name="operation-cancel"),
]
