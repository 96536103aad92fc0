"""What the catalog's templates show that a view need not compute: a model's colour."""

from __future__ import annotations

from django import template

from web import display

register = template.Library()


@register.filter
def hue(model_id: int | None) -> str:
    """A model's colour class (``{{ model.pk|hue }}``), the same on every page."""
    return display.hue(model_id)


@register.filter
def cards_said(indices: list[int]) -> str:
    """Card indexes said as cards (``{{ indices|cards_said }}``): "2 cards (#3, #4)", not "3, 4"."""
    return display.cards_said(list(indices))
