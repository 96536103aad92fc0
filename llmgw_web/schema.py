"""The OpenAPI schema, as strict as the server: its errors, its closed inputs, its empty query values.

Every endpoint can answer bad input (400), no sign-in (401), a missing permission (403), an
object that is not there (404) and too many requests (429), and one that takes a body a body over
the limit (413), always in the one error shape of ``base/api/errors.py``. An operation that
documents a code itself keeps its own description; this adds the ones it leaves out, so a client
(and schemathesis, ``tests/project/test_schema_fuzz.py``) can rely on the schema for every answer.

An input that refuses fields it does not know (``base.api.inputs.StrictInput``) says so
(``additionalProperties: false``), and an optional query parameter given empty is read as not given
(``allowEmptyValue``), as the filters and the pager do; no text input takes the NUL character.
"""

from __future__ import annotations

from typing import Any, Literal

from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.plumbing import force_instance
from drf_spectacular.utils import OpenApiResponse

from base.api.inputs import StrictInput

_ERRORS = {
    "400": "Invalid input: the sentence says what is wrong and how to fix it",
    "401": "Not signed in: no valid token or session",
    "403": "Missing the permission (its name and the roles that give it)",
    "404": "not_found: no such object",
    "429": "Too many requests: the sentence says when to try again",
}
_TOO_LARGE = {"413": "too_large: the body is over the limit the sentence gives"}


class AutoSchema(SpectacularAutoSchema):
    def _get_response_bodies(self, direction: Literal["request", "response"] = "response") -> dict[str, Any]:
        responses: dict[str, Any] = super()._get_response_bodies(direction)
        from catalog.api.serializers import ErrorSerializer

        errors = {**_ERRORS, **(_TOO_LARGE if self.method in ("POST", "PUT", "PATCH") else {})}
        for code, description in errors.items():
            if code not in responses:
                responses[code] = self._get_response_for_code(
                    OpenApiResponse(ErrorSerializer, description=description), code, direction=direction
                )
        return responses

    def _map_serializer(
        self, serializer: Any, direction: Any, bypass_extensions: bool = False
    ) -> dict[str, Any]:
        schema: dict[str, Any] = super()._map_serializer(serializer, direction, bypass_extensions)
        if isinstance(force_instance(serializer), StrictInput):
            schema["additionalProperties"] = False
        return schema


# Django's and DRF's text fields refuse the NUL character (a database cannot store it), and DRF's trim
# the whitespace around a value, so a required one of spaces alone is blank: said as a pattern on each
# text input that has none of its own.
NO_NUL = "^[^\\u0000]*$"
NOT_BLANK = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$"


def _no_nul(schema: Any) -> None:
    if not isinstance(schema, dict):
        return
    if schema.get("type") == "string" and not {"pattern", "enum", "format"} & set(schema):
        schema["pattern"] = NOT_BLANK if schema.get("minLength", 0) >= 1 else NO_NUL
    for key in ("properties", "patternProperties"):
        for child in schema.get(key, {}).values():
            _no_nul(child)
    for key in ("items", "additionalProperties"):
        _no_nul(schema.get(key))
    for key in ("oneOf", "anyOf", "allOf"):
        for child in schema.get(key, []):
            _no_nul(child)


def inputs_as_the_server_reads_them(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular post-processing hook: every optional query parameter ``allowEmptyValue``, and
    every text input (parameters and request bodies) without the NUL character."""
    for path in result.get("paths", {}).values():
        for operation in path.values():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else []:
                if parameter.get("in") == "query" and not parameter.get("required"):
                    parameter["allowEmptyValue"] = True
                _no_nul(parameter.get("schema"))
    for name, schema in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request"):
            _no_nul(schema)
    return result
