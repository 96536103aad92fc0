"""The audit log in the admin: read-only, whoever is asking."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """Read-only: the audit log is append-only, whoever is asking.

    The leads' pages (/audit/: filters by who, what, when, via, request and operation, keyset
    pages, exports) are where the log is read. Here the list stays cheap at a million entries:
    no date navigation (it sorted the whole table), no filters whose choices are the table's
    distinct values (a scan each), and the count taken once, not twice. Deep pages still read
    every row before them (the admin pages by offset); /audit/ does not.
    """

    list_display = ["at", "actor", "via", "action", "object_type", "object_key", "message", "request_id"]
    list_filter = ["via"]  # its choices are Via's, not read from the table
    search_fields = ["actor", "object_key", "object_repr", "message", "request_id"]
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
