"""``GET /api/audit/``: the audit log read-only, with the page's filters and cursor pages, and its exports."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import QuerySet
from django.http import HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.views import APIView

from audit.export import COLUMNS, KINDS, export_response
from audit.forms import AuditFilterForm
from audit.models import AuditEntry
from audit.selectors import entries_matching
from audit.summary import summarize
from base.api.cached import KeptList
from base.rules import Rule


class AuditEntrySerializer(serializers.ModelSerializer):
    summary = serializers.SerializerMethodField()

    class Meta:
        model = AuditEntry
        fields = COLUMNS  # the exports' columns, in their order
        read_only_fields = fields

    def get_summary(self, entry: AuditEntry) -> str:
        return summarize(entry)


class NewestFirst(CursorPagination):
    """Cursor pages on the id: the thousandth page costs what the first does. ``page_size`` outside 1
    to 1000 is refused with a sentence, not cut or ignored silently."""

    ordering = "-id"
    page_size = 100
    max_page_size = 1000
    page_size_query_param = "page_size"

    def get_page_size(self, request: Any) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw in (None, ""):
            return self.page_size
        if not raw.isdigit() or not 1 <= int(raw[:12]) <= self.max_page_size or len(raw) > 12:
            raise ValidationError(
                {
                    "page_size": f"page_size must be a whole number from 1 to {self.max_page_size}, not {raw[:40]!r}."
                }
            )
        return int(raw)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters: list[dict[str, Any]] = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": self.max_page_size}
        return parameters


_DESCRIPTIONS = {
    "who": "The actor's name (a user, a command, a worker).",
    "object_type": "model, profile, node, replica, restart, ...",
    "object": "The object's name, exactly.",
    "action": "create, update, delete, resize, ...",
    "since": "From this day on (included).",
    "until": "Up to this day (included).",
    "operation": "A restart's id: its entries and its request's.",
}


def _filter_schema(field: forms.Field) -> dict[str, Any]:
    """A filter's schema, with the bounds AuditFilterForm holds it to."""
    if isinstance(field, forms.DateField):
        return {"type": "string", "format": "date"}
    if isinstance(field, forms.IntegerField):
        return {"type": "integer", "minimum": field.min_value, "maximum": field.max_value}
    if isinstance(field, forms.ChoiceField):
        choices: list[tuple[Any, Any]] = list(field.choices)  # type: ignore[arg-type]
        return {"type": "string", "enum": [value for value, _ in choices if value]}
    assert isinstance(field, forms.CharField)
    return {"type": "string", "maxLength": field.max_length}


# The page's filters, as AuditFilterForm reads them (so the schema says what the form refuses).
_FILTER_PARAMS = [
    OpenApiParameter(name, _filter_schema(field), description=_DESCRIPTIONS.get(name, ""))
    for name, field in AuditFilterForm.base_fields.items()
]


def filtered(request: Request) -> QuerySet[AuditEntry]:
    form = AuditFilterForm(request.query_params)
    if not form.is_valid():
        # "since" after "until" is a rule over two parameters, which the schema cannot say: its own code.
        swapped = form.has_error("__all__", "dates_swapped")
        sentence = f"The filters are wrong: {form.errors_sentence()}"
        raise ValidationError(
            sentence, code="dates_swapped" if swapped and len(form.errors) == 1 else "invalid"
        )
    return entries_matching(form.cleaned_data)


@extend_schema(parameters=_FILTER_PARAMS, summary="The audit log, newest first")
class AuditEntryList(KeptList, generics.ListAPIView):
    """Each page kept under the log's version (base/api/cached.py): an entry appended raises it."""

    kept_areas = ("audit",)
    serializer_class = AuditEntrySerializer
    required_permission: Rule = "audit.view_auditentry"
    pagination_class = NewestFirst
    filter_backends: list[Any] = []
    queryset = AuditEntry.objects.none()

    def get_queryset(self) -> QuerySet[AuditEntry]:
        return filtered(self.request)


@extend_schema(
    parameters=[
        *_FILTER_PARAMS,
        OpenApiParameter("kind", OpenApiTypes.STR, OpenApiParameter.PATH, enum=sorted(KINDS)),
    ],
    summary="The filtered audit log as CSV or JSON Lines, streamed, oldest first",
    responses={(200, "text/csv"): OpenApiTypes.STR, (200, "application/x-ndjson"): OpenApiTypes.STR},
)
class AuditExport(APIView):
    required_permission: Rule = "audit.export_auditentry"

    def get(self, request: Request, kind: str) -> HttpResponseBase:
        if kind not in KINDS:
            raise ValidationError(f"No export as {kind!r}: ask for csv or jsonl.", code="invalid")
        return export_response(filtered(request), kind)
