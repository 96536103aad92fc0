"""Sets who is acting for every request, with a request id echoed back."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from base.actor import Actor, acting_as

# A caller may bring its own id (a proxy, a script): accepted when it is short
# and plain, so nothing odd lands in the audit log.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def via_for_path(path: str) -> str:
    if path.startswith("/api/"):
        return "api"
    if path.startswith("/admin/"):
        return "admin"
    return "ui"


class ActorMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        given = request.headers.get("X-Request-ID", "")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        with acting_as(Actor(via=via_for_path(request.path), request_id=request_id, request=request)):
            response = self.get_response(request)
        response["X-Request-ID"] = request_id
        return response
