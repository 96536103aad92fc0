"""DRF throttling with the rates read from settings at each request (LLMGW_API_RATE_*), so a
deployment, or a test, sets them without reloading DRF's settings."""

from __future__ import annotations

from django.conf import settings
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle


class AnonymousRate(AnonRateThrottle):
    def get_rate(self) -> str:
        return f"{settings.LLMGW_API_RATE_ANONYMOUS}/min"


class UserRate(UserRateThrottle):
    def get_rate(self) -> str:
        return f"{settings.LLMGW_API_RATE_USER}/min"
