"""The OpenAPI schema's errors, documented on every operation.

Every endpoint can answer bad input (400), no sign-in (401), a missing permission (403), an
object that is not there (404) and too many requests (429), always in the one error shape of
``base/api/errors.py``. An operation that documents a code itself keeps its own description;
this adds the ones it leaves out, so a client (and schemathesis, ``tests/project/test_schema_fuzz.py``)
can rely on the schema for every answer.
"""

from __future__ import annotations

from typing import Any, Literal

from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.utils import OpenApiResponse

_ERRORS = {
    "400": "Invalid input: the sentence says what is wrong and how to fix it",
    "401": "Not signed in: no valid token or session",
    "403": "Missing the permission (its name and the roles that give it)",
    "404": "not_found: no such object",
    "429": "Too many requests: the sentence says when to try again",
}


class AutoSchema(SpectacularAutoSchema):
    def _get_response_bodies(self, direction: Literal["request", "response"] = "response") -> dict[str, Any]:
        responses: dict[str, Any] = super()._get_response_bodies(direction)
        from catalog.api.serializers import ErrorSerializer

        for code, description in _ERRORS.items():
            if code not in responses:
                responses[code] = self._get_response_for_code(
                    OpenApiResponse(ErrorSerializer, description=description), code, direction=direction
                )
        return responses
