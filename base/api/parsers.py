"""DRF's JSON parser with the nesting bounded: a body nested deeper than MAX_DEPTH is bad input
(400 in the one error shape), never a RecursionError and a 500. Nothing the API takes is nested
more than a few levels; the bound also keeps every later walk over the data (validation, the audit
entry's copy, the error sentences) far from Python's recursion limit."""

from __future__ import annotations

from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError

MAX_DEPTH = 32

TOO_DEEP = (
    f"The JSON body is nested more than {MAX_DEPTH} levels deep; nothing this API takes is nested "
    "that deep: send the fields the operation's schema names (/api/schema/)."
)


def depth(value: Any) -> int:
    """How many arrays and objects deep ``value`` is nested (0 for a scalar), without recursion."""
    deepest = 0
    pending = [(value, 0)]
    while pending:
        item, level = pending.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            level += 1
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                break  # deep enough to refuse: no need to walk the rest
            pending.extend((child, level) for child in item)
    return deepest


class JSONParser(parsers.JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            # json's decoder gave up before MAX_DEPTH's check could run: the same refusal.
            raise ParseError(TOO_DEEP) from None
        if depth(data) > MAX_DEPTH:
            raise ParseError(TOO_DEEP)
        return data
