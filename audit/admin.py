"""The audit log in the admin: read-only, whoever is asking."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import EmptyResultSet
from django.core.paginator import Paginator
from django.http import HttpRequest
from django.utils.functional import cached_property

from audit.models import AuditEntry
from versions.cache import remembered


class CountKept(Paginator):
    """The change list's count, a scan of every matching row (a million entries: most of the page's
    time), kept under the log's version (versions/cache.py) and the query's SQL: any entry
    appended raises the version, so the count shown is the log's as of the request."""

    @cached_property
    def count(self) -> int:
        count = Paginator.count.func  # type: ignore[attr-defined]
        try:
            key = str(self.object_list.query)  # type: ignore[attr-defined]
        except EmptyResultSet:  # a query that matches nothing by construction: nothing to scan
            return count(self)
        return remembered("admin-audit-count", ["audit"], [key], lambda: count(self))


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """Read-only: the audit log is append-only, whoever is asking.

        The leads' pages (/audit/: filters by who, what, when, via, request and operation, keyset
        pages, exports) are where the log is read. Here the list stays cheap at a million entries:
        no date navigation (it sorted the whole table), no filters whose choices are the table's
        distinct values (a scan each), and the count taken once, not twice, and kept under the log's
    version (``CountKept``) until an entry is appended, and the rows drawn kept under it too.
    Deep pages still read
        every row before them (the admin pages by offset); /audit/ does not.
    """

    list_display = ["at", "actor", "via", "action", "object_type", "object_key", "message", "request_id"]
    list_filter = ["via"]  # its choices are Via's, not read from the table
    search_fields = ["actor", "object_key", "object_repr", "message", "request_id"]
    show_full_result_count = False
    paginator = CountKept
    # No action on the log (nobody may change or delete an entry), so no checkbox per row: the rows
    # drawn are the same for every reader and kept under the log's version
    # (templates/admin/audit/auditentry/change_list.html, audit/templatetags/audit_admin.py).
    actions = None
    list_per_page = 50  # as /audit/ pages: the rows drawn through the admin's templates are most of its time

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
