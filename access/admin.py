"""API tokens in the admin: listed for admins, revoked through the service (audited); never made here
(the secret is shown once, to its owner: the tokens page or ``manage.py token``)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from access.models import Token
from access.services import token_revoke


@admin.register(Token)
class TokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "token_key", "created", "expiry"]
    list_filter = ["expiry"]
    search_fields = ["name", "user__username", "token_key"]
    fields = ("name", "user", "token_key", "created", "expiry")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def delete_model(self, request: HttpRequest, obj: Token) -> None:
        token_revoke(token=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Token]) -> None:
        for token in queryset:
            token_revoke(token=token)
