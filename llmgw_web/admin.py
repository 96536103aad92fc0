"""The admin site: open to whoever holds ``access.open_admin`` (the editor, lead and admin roles).

Django's own site asks for ``is_staff``, a flag on each user; here a role decides, like everywhere
else. Inside, each model's pages keep Django's per-model checks (view, add, change, delete).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse

from base.rules import read_permissions_once

OPEN_ADMIN = "access.open_admin"


class SignInForm(AdminAuthenticationForm):
    def confirm_login_allowed(self, user: object) -> None:
        if not (user.is_active and user.has_perm(OPEN_ADMIN)):  # type: ignore[attr-defined]
            raise forms.ValidationError(
                "This account may not open the admin: it needs the editor, lead or admin role. "
                "Sign in at /accounts/login/ for the operator pages.",
                code="invalid_login",
            )


class AdminSite(admin.AdminSite):
    site_header = "llmgw admin"
    site_title = "llmgw admin"
    login_form = SignInForm

    def has_permission(self, request: HttpRequest) -> bool:
        read_permissions_once(request)  # then every model's checks on the page use the one set
        user = request.user
        return bool(user.is_active and user.has_perm(OPEN_ADMIN))

    def app_index(self, request: HttpRequest, app_label: str, extra_context: Any = None) -> TemplateResponse:
        # Django answers 404 for an app none of whose models the user may open: it is a refusal.
        if not self.get_app_list(request, app_label):
            raise PermissionDenied(f"Your role opens none of the {app_label!r} pages of the admin.")
        return super().app_index(request, app_label, extra_context)
