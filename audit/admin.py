"""The audit log in the admin: read-only, whoever is asking."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """Read-only: the audit log is append-only, whoever is asking."""

    list_display = ["at", "actor", "via", "action", "object_type", "object_key", "request_id"]
    list_filter = ["via", "action", "object_type"]
    search_fields = ["actor", "object_key", "object_repr", "message", "request_id"]
    date_hierarchy = "at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
