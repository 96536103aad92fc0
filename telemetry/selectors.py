"""Reads of the telemetry that other apps need: which cards a foreign process holds, and each
card's latest reading for a page (one query for any number of cards)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import NamedTuple

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from catalog.models import Node
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
    at: datetime | None = None  # when it was read
    foreign: tuple[
        tuple[str, int | None], ...
    ] = ()  # each foreign process: its name and PID, as nvidia-smi gave them
    fresh: bool = True  # younger than LLMGW_TELEMETRY_STALE_SECONDS: placement heeds its foreign memory

    @property
    def foreign_held(self) -> bool:
        """A process the catalog does not know holds memory on it, as a reading placement heeds says."""
        return self.fresh and self.foreign_mib > 0


def _foreign(processes: object) -> tuple[tuple[str, int | None], ...]:
    if not isinstance(processes, list):
        return ()
    return tuple(
        (str(p.get("name") or "a process"), p.get("pid") if isinstance(p.get("pid"), int) else None)
        for p in processes
        if isinstance(p, dict) and p.get("foreign")
    )


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
        "at",
        "processes",
    )
    stale = timezone.now() - timedelta(seconds=settings.LLMGW_TELEMETRY_STALE_SECONDS)
    return {
        (node, index): CardUse(
            used, total, util, temp, foreign or 0, at, _foreign(processes) if foreign else (), at >= stale
        )
        for node, index, used, total, util, temp, foreign, at, processes in rows
    }


def unreachable_node_ids() -> set[int]:
    """Nodes whose agent is not answering: the reconciler marked it unreachable, or the last
    telemetry request to it failed (whichever noticed first). One query."""
    return set(
        Node.objects.filter(Q(reachable=False) | Q(reading__error__gt="")).values_list("pk", flat=True)
    )


def last_seen_of_nodes(node_ids: list[int]) -> dict[int, NodeReading]:
    """When each of these nodes' agents last answered a telemetry request (or why not): one query."""
    return {r.node_id: r for r in NodeReading.objects.filter(node_id__in=node_ids)}
