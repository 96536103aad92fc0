"""``/metrics``: the fleet's figures for Prometheus, behind a bearer token.

Refused unless ``LLMGW_METRICS_TOKEN`` is set (404: off by default) and the scrape carries it
(``Authorization: Bearer <token>``, 401 otherwise): the figures name every node and model.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from base.rules import PUBLIC, requires
from web.metrics import FleetCollector


# No role: Prometheus is no user. The view checks its own bearer token (above), so the gate is open.
@requires(PUBLIC)
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.LLMGW_METRICS_TOKEN
    if not token:
        return HttpResponse(
            "The metrics endpoint is off: set LLMGW_METRICS_TOKEN (32 characters or more) and give Prometheus "
            "the same token as its bearer_token.\n",
            status=404,
            content_type="text/plain",
        )
    given = request.headers.get("Authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token.encode()):
        response = HttpResponse(
            "A valid bearer token is required (Authorization: Bearer <LLMGW_METRICS_TOKEN>).\n",
            status=401,
            content_type="text/plain",
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
