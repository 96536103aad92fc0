from __future__ import annotations

from django.apps import AppConfig


class VersionsConfig(AppConfig):
    name = "versions"
    verbose_name = "Fleet versions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from versions.triggers import repair_sqlite

        post_migrate.connect(repair_sqlite, sender=self, dispatch_uid="versions.repair_sqlite")
