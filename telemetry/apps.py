from __future__ import annotations

from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "telemetry"
    verbose_name = "card telemetry"
    default_auto_field = "django.db.models.BigAutoField"
