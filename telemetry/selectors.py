"""Reads of the telemetry that other apps need: which cards a foreign process holds, and each
card's latest reading for a page (one query for any number of cards)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import NamedTuple

from django.conf import settings
from django.utils import timezone

from telemetry.models import CardReading, NodeReading


def foreign_held_card_ids() -> set[int]:
    """Cards whose latest reading, younger than LLMGW_TELEMETRY_STALE_SECONDS, shows memory held
    by a process the catalog does not know: placement takes none of them."""
    fresh = timezone.now() - timedelta(seconds=settings.LLMGW_TELEMETRY_STALE_SECONDS)
    return set(CardReading.objects.filter(foreign_mib__gt=0, at__gte=fresh).values_list("card_id", flat=True))


def readings_of(card_ids: Iterable[int]) -> dict[int, CardReading]:
    """The latest reading of each of these cards that has one, by card id."""
    ids = list(card_ids)
    return {r.card_id: r for r in CardReading.objects.filter(card_id__in=ids)} if ids else {}


class CardUse(NamedTuple):
    """A card's latest reading as the nodes grid draws it (MiB, percent, degrees)."""

    used_mib: int | None
    total_mib: int | None
    utilization: int | None
    temperature: int | None
    foreign_mib: int


def card_use_of_nodes(node_ids: list[int], *, foreign_only: bool = False) -> dict[tuple[int, int], CardUse]:
    """Each card's latest reading on these nodes, by (node id, card index): one query.
    ``foreign_only``: only the cards a foreign process holds memory on."""
    found = CardReading.objects.filter(card__node_id__in=node_ids)
    if foreign_only:
        found = found.filter(foreign_mib__gt=0)
    rows = found.values_list(
        "card__node_id",
        "card__index",
        "memory_used_mib",
        "memory_total_mib",
        "utilization_percent",
        "temperature_c",
        "foreign_mib",
    )
    return {
        (node, index): CardUse(used, total, util, temp, foreign or 0)
        for node, index, used, total, util, temp, foreign in rows
    }


def last_seen_of_nodes(node_ids: list[int]) -> dict[int, NodeReading]:
    """When each of these nodes' agents last answered a telemetry request (or why not): one query."""
    return {r.node_id: r for r in NodeReading.objects.filter(node_id__in=node_ids)}
