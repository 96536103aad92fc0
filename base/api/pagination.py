"""List pages: at most MAX_LIMIT rows a page, and an offset the database can hold."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

MAX_LIMIT = 1000
MAX_OFFSET = 10**9


class Pages(LimitOffsetPagination):
    """``?limit=`` beyond MAX_LIMIT is refused with a sentence, not cut silently or sent to the
    database as a number it cannot hold (it answered 500 before)."""

    max_limit = MAX_LIMIT

    def _number(self, request: Any, name: str, top: int) -> int | None:
        raw = request.query_params.get(name)
        if raw in (None, ""):
            return None
        if not raw.isdigit() or len(raw) > 12 or int(raw) > top:
            raise ValidationError(
                {name: f"{name} must be a whole number from 0 to {top}, not {raw[:40]!r}."}, code="invalid"
            )
        return int(raw)

    def get_limit(self, request: Any) -> int | None:
        limit = self._number(request, self.limit_query_param, MAX_LIMIT)
        if limit is None:
            return self.default_limit
        return limit or self.default_limit

    def get_offset(self, request: Any) -> int:
        return self._number(request, self.offset_query_param, MAX_OFFSET) or 0

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        """The two parameters with the bounds the pager holds them to (an empty one is the default)."""
        return [
            {
                "name": self.limit_query_param,
                "required": False,
                "in": "query",
                "description": f"Rows on this page, at most {MAX_LIMIT} (0 or none: {self.default_limit}).",
                "schema": {"type": "integer", "minimum": 0, "maximum": MAX_LIMIT},
            },
            {
                "name": self.offset_query_param,
                "required": False,
                "in": "query",
                "description": "Rows to skip before this page.",
                "schema": {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET},
            },
        ]
