"""``GET /api/audit/``: the audit log read-only, with the page's filters and cursor pages, and its exports."""

from __future__ import annotations

from typing import Any

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
    """Cursor pages on the id: the thousandth page costs what the first does."""

    ordering = "-id"
    page_size = 100
    max_page_size = 1000
    page_size_query_param = "page_size"


_FILTER_PARAMS = [
    OpenApiParameter("who", OpenApiTypes.STR, description="The actor's name (a user, a command, a worker)."),
    OpenApiParameter(
        "object_type", OpenApiTypes.STR, description="model, profile, node, replica, restart, ..."
    ),
    OpenApiParameter("object", OpenApiTypes.STR, description="The object's name, exactly."),
    OpenApiParameter("action", OpenApiTypes.STR, description="create, update, delete, resize, ..."),
    OpenApiParameter("via", OpenApiTypes.STR, enum=["ui", "api", "admin", "cli", "worker"]),
    OpenApiParameter("since", OpenApiTypes.DATE, description="From this day on (included)."),
    OpenApiParameter("until", OpenApiTypes.DATE, description="Up to this day (included)."),
    OpenApiParameter("request_id", OpenApiTypes.STR),
    OpenApiParameter(
        "operation", OpenApiTypes.INT, description="A restart's id: its entries and its request's."
    ),
]


def filtered(request: Request) -> QuerySet[AuditEntry]:
    form = AuditFilterForm(request.query_params)
    if not form.is_valid():
        raise ValidationError(
            {"code": "invalid", "message": f"The filters are wrong: {form.errors_sentence()}"}
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
    parameters=_FILTER_PARAMS,
    summary="The filtered audit log as CSV or JSON Lines, streamed, oldest first",
    responses={(200, "text/csv"): OpenApiTypes.STR, (200, "application/x-ndjson"): OpenApiTypes.STR},
)
class AuditExport(APIView):
    required_permission: Rule = "audit.export_auditentry"

    def get(self, request: Request, kind: str) -> HttpResponseBase:
        if kind not in KINDS:
            raise ValidationError(
                {"code": "invalid", "message": f"No export as {kind!r}: ask for csv or jsonl."}
            )
        return export_response(filtered(request), kind)
