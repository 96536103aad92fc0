from __future__ import annotations

from django.apps import AppConfig


class CatalogConfig(AppConfig):
    name = "catalog"
    verbose_name = "Fleet catalog"
    default_auto_field = "django.db.models.BigAutoField"
