from __future__ import annotations

from django.contrib.admin.apps import AdminConfig as DjangoAdminConfig


class AdminConfig(DjangoAdminConfig):
    """Django's admin with the project's site (llmgw_web/admin.py): a role opens it, not is_staff."""

    default_site = "llmgw_web.admin.AdminSite"
