"""Restart operations in the admin: shown, never edited there."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from operations.models import RestartOperation, RestartStep


class ReadOnlyAdmin(admin.ModelAdmin):
    """Shown, never edited here: operations change through their services only."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class RestartStepInline(admin.TabularInline):
    model = RestartStep
    extra = 0
    fields = readonly_fields = (
        "old_replica",
        "new_replica",
        "node",
        "cards",
        "in_place",
        "state",
        "reason",
        "started_at",
        "finished_at",
    )

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(RestartOperation)
class RestartOperationAdmin(ReadOnlyAdmin):
    inlines = [RestartStepInline]
    list_display = [
        "id",
        "model",
        "profile",
        "state",
        "in_place",
        "requested_by_name",
        "via",
        "created_at",
        "finished_at",
        "worker",
    ]
    list_filter = ["state", "via", "in_place"]
    search_fields = ["model__name", "requested_by_name", "reason"]
    list_select_related = ["model", "profile__model"]
