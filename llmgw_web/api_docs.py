"""The OpenAPI schema and Swagger UI, behind sign-in unless LLMGW_API_DOCS_PUBLIC opens them.

Swagger UI is drf-spectacular's split view: its start-up script is a file of its own, not inline, so
the page keeps to the Content Security Policy (llmgw_web/settings.py, "CSP").
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework import exceptions
from rest_framework.response import Response

from base.rules import PUBLIC, SIGNED_IN, RequiredPermission


class _DocsRule:
    @property
    def required_permission(self) -> str:
        return PUBLIC if settings.LLMGW_API_DOCS_PUBLIC else SIGNED_IN


class SchemaView(_DocsRule, SpectacularAPIView):
    permission_classes = [RequiredPermission]


class SwaggerView(_DocsRule, SpectacularSwaggerSplitView):
    permission_classes = [RequiredPermission]

    def handle_exception(self, exc: Exception) -> Any:
        # A browser page: an anonymous visitor is sent to sign in, not shown a JSON 401.
        if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
            return redirect_to_login(self.request.get_full_path())
        response: Response = super().handle_exception(exc)
        return response
