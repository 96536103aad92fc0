"""One error shape for the whole API: {"detail": "...", "code": "..."} (+ "change")."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from base.errors import DomainError


def _flatten(detail: Any, prefix: str = "") -> list[str]:
    """DRF's nested validation errors as "field: sentence" strings."""
    if isinstance(detail, dict):
        out: list[str] = []
        for key, value in detail.items():
            label = "" if key in ("non_field_errors", "detail") else f"{prefix}{key}"
            out += _flatten(value, f"{label}." if label else "")
        return out
    if isinstance(detail, list):
        out = []
        for item in detail:
            out += _flatten(item, prefix)
        return out
    text = str(detail)
    return [f"{prefix.rstrip('.')}: {text}" if prefix else text]


def _first_code(detail: Any, default: str) -> str:
    if isinstance(detail, exceptions.ErrorDetail):
        return detail.code or default
    if isinstance(detail, dict):
        for value in detail.values():
            return _first_code(value, default)
    if isinstance(detail, list) and detail:
        return _first_code(detail[0], default)
    return default


def _not_found(exc: Exception, context: dict[str, Any]) -> str | None:
    """A detail lookup that found nothing, in the operators' words: "No model 'nope' in the catalog."."""
    view = context.get("view")
    queryset = getattr(view, "queryset", None)
    kwargs = getattr(view, "kwargs", None) or {}
    if queryset is None:
        return None
    key = getattr(view, "lookup_url_kwarg", None) or getattr(view, "lookup_field", "pk")
    value = kwargs.get(key)
    if value is None:
        return None
    label = queryset.model._meta.verbose_name
    where = "in the catalog" if queryset.model._meta.app_label == "catalog" else "here"
    return f"No {label} {value!r} {where}."


def _too_large() -> Response:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    sentence = (
        f"The request body is over the {limit / 1024 / 1024:g} MiB the API takes ({limit} bytes, "
        "DATA_UPLOAD_MAX_MEMORY_SIZE): send less in one request."
    )
    return Response(
        {"detail": sentence, "code": "too_large"}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    )


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        return Response(exc.as_dict(), status=exc.status)
    if isinstance(exc, RequestDataTooBig):
        # Django's own answer would be an HTML 400: the body was not read, only its declared length.
        return _too_large()
    if isinstance(exc, Http404) and (sentence := _not_found(exc, context)):
        return Response({"detail": sentence, "code": "not_found"}, status=status.HTTP_404_NOT_FOUND)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # unknown exceptions are not swallowed: Django's 500 handling applies
    if isinstance(exc, exceptions.ValidationError):
        sentences = _flatten(exc.detail)
        code = _first_code(exc.detail, "invalid")
        # A missing, null or blank value is bad input like any other: one code for it.
        invalid = code in ("invalid", "required", "null", "blank")
        response.data = {"detail": "; ".join(sentences), "code": "invalid" if invalid else code}
        response.status_code = status.HTTP_400_BAD_REQUEST
        return response
    if isinstance(exc, exceptions.APIException):
        detail = exc.detail
        response.data = {"detail": " ".join(_flatten(detail)), "code": _first_code(detail, exc.default_code)}
    return response
