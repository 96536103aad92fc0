"""Input serializers that refuse what they do not know: an unknown field, a string or a bool for a number."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class StrictIntegerField(serializers.IntegerField):
    """A JSON number that is a whole number: "4", 4.0 and true are refused, not coerced.

    ``bounds``: the range an operation's own rule holds the number to, said in the schema (its
    minimum and maximum) while the rule still answers a number outside it, with its own code and
    sentence (``gpus_range``, ``context_range``...). ``min_value``/``max_value`` check it here instead.
    """

    default_error_messages = {"invalid": "must be a whole number (a JSON number such as 4), not {kind}."}

    def __init__(self, *, bounds: tuple[int, int] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if bounds is not None:
            # Read by drf-spectacular for the schema; no validator is added for them.
            self.min_value, self.max_value = bounds

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            kind = "true/false" if isinstance(data, bool) else f"{type(data).__name__} {data!r}"[:60]
            self.fail("invalid", kind=kind)
        return data


class StrictInput(serializers.Serializer):
    """Refuses fields it does not know, so a misspelt option is not silently ignored."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = (
            sorted(set(self.initial_data) - set(self.fields)) if isinstance(self.initial_data, dict) else []
        )
        if unknown:
            raise serializers.ValidationError(
                f"unknown field(s) {', '.join(unknown)}; this request takes {', '.join(self.fields)}."
            )
        return attrs


class StrictNumberField(serializers.FloatField):
    """A JSON number: "600" and true are refused, not coerced."""

    default_error_messages = {
        "invalid": "must be a number of seconds (a JSON number such as 600), not {kind}."
    }

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            kind = "true/false" if isinstance(data, bool) else f"{type(data).__name__} {data!r}"[:60]
            self.fail("invalid", kind=kind)
        return super().to_internal_value(data)
