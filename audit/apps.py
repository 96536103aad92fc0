from __future__ import annotations

from django.apps import AppConfig


class AuditConfig(AppConfig):
    """The append-only, hash-chained audit log and who is acting (docs/design.md, "The audit log")."""

    name = "audit"
    verbose_name = "Audit log"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from audit import checks  # noqa: F401 - registers the deploy checks
