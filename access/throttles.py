"""DRF throttling with the rates read from settings at each request (LLMGW_API_RATE_*), so a
deployment, or a test, sets them without reloading DRF's settings.

The counts live in the "throttle" cache, which every process shares (the database's table
``access_throttle_cache``, or Redis with ``LLMGW_REDIS_URL``): two web processes, or two gunicorn
workers, allow the rate once between them, not once each. An anonymous caller is counted by its
address as the sign-in waits count it (access/client.py), never by an ``X-Forwarded-For`` it wrote.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.cache import caches
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle

from access.client import client_address


class _Shared:
    def __init__(self) -> None:
        self.cache = caches["throttle"]
        super().__init__()

    def get_ident(self, request: Any) -> str:
        return client_address(request) or ""


class AnonymousRate(_Shared, AnonRateThrottle):
    def get_rate(self) -> str:
        return f"{settings.LLMGW_API_RATE_ANONYMOUS}/min"


class UserRate(_Shared, UserRateThrottle):
    def get_rate(self) -> str:
        return f"{settings.LLMGW_API_RATE_USER}/min"
