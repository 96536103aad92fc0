"""The OpenAPI schema and Swagger UI, behind sign-in unless LLMGW_API_DOCS_PUBLIC opens them.

Swagger UI is drf-spectacular's split view: its start-up script is a file of its own, not inline, so
the page keeps to the Content Security Policy (llmgw_web/settings.py, "CSP").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from drf_spectacular.renderers import OpenApiYamlRenderer
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework import exceptions
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from base.rules import PUBLIC, SIGNED_IN, RequiredPermission


class _DocsRule:
    @property
    def required_permission(self) -> str:
        return PUBLIC if settings.LLMGW_API_DOCS_PUBLIC else SIGNED_IN


class _PlainYamlRenderer(OpenApiYamlRenderer):
    """The schema's YAML as plain text, which a browser shows rather than downloads."""

    media_type = "text/plain"
    charset = "utf-8"
    format = "yaml-text"


class _BrowserShowsSchema(DefaultContentNegotiation):
    """A browser (it asks for HTML) is answered the YAML as text it can show; clients that ask for
    the OpenAPI types, JSON or a ``?format=`` are answered as before."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        asked_format = format_suffix or request.query_params.get(
            self.settings.URL_FORMAT_OVERRIDE or "format"
        )
        if not asked_format and "text/html" in request.META.get("HTTP_ACCEPT", ""):
            renderer = _PlainYamlRenderer()
            return renderer, renderer.media_type
        return super().select_renderer(request, renderers, format_suffix)


class SchemaView(_DocsRule, SpectacularAPIView):
    permission_classes = [RequiredPermission]
    content_negotiation_class = _BrowserShowsSchema


class SwaggerView(_DocsRule, SpectacularSwaggerSplitView):
    permission_classes = [RequiredPermission]
    # drf-spectacular's page with a bar above it that leads back to the app.
    template_name = "api_docs/swagger_ui.html"

    def handle_exception(self, exc: Exception) -> Any:
        # A browser page: an anonymous visitor is sent to sign in, not shown a JSON 401.
        if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
            return redirect_to_login(self.request.get_full_path())
        response: Response = super().handle_exception(exc)
        return response
