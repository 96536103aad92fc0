from __future__ import annotations

from django.apps import AppConfig


class AccessConfig(AppConfig):
    name = "access"
    verbose_name = "Access: roles and API tokens"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from access import checks  # noqa: F401  (registers the URL check)
        from base.roles import sync_roles_after_migrate

        post_migrate.connect(sync_roles_after_migrate, dispatch_uid="access.sync_roles")
