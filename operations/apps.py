from __future__ import annotations

from django.apps import AppConfig


class OperationsConfig(AppConfig):
    """Restarts of replicas through the node agents (docs/design.md, "Restarts")."""

    name = "operations"
    verbose_name = "Restart operations"
    default_auto_field = "django.db.models.BigAutoField"
