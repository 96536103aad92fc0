from __future__ import annotations

from typing import TYPE_CHECKING

from rest_framework import permissions

if TYPE_CHECKING:  # DRF's settings import this module while rest_framework.views loads
    from rest_framework.request import Request
    from rest_framework.views import APIView


class ModelPermissionsWithRead(permissions.DjangoModelPermissions):
    """Reads need sign-in; writes need the model's add/change/delete permission."""

    authenticated_users_only = True
    perms_map = {
        **permissions.DjangoModelPermissions.perms_map,
        "GET": [],
        "OPTIONS": [],
        "HEAD": [],
    }

    def has_permission(self, request: Request, view: APIView) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        if getattr(view, "queryset", None) is None and not hasattr(view, "get_queryset"):
            return True  # a view with no model behind it (the API root): sign-in is all it needs
        return super().has_permission(request, view)


class CanResize(permissions.BasePermission):
    message = "You need the 'resize model' permission to resize a model or change its context."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return bool(
            request.user and request.user.is_authenticated and request.user.has_perm("catalog.resize_model")
        )


class CanRestart(permissions.BasePermission):
    message = "You need the 'restart model' permission to restart a model's replicas."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return bool(
            request.user and request.user.is_authenticated and request.user.has_perm("catalog.restart_model")
        )
