"""Django's 404 for a path no URL matches: under /api/, the API's one error shape."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults


def not_found(request: HttpRequest, exception: Any = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse(
            {"detail": f"No API endpoint at {request.path}: /api/docs/ lists them.", "code": "not_found"},
            status=404,
        )
    return defaults.page_not_found(request, exception)
