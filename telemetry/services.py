"""Sampling the agents' card telemetry and keeping it: the latest reading per card, a short
history, each node's last answer. A process holding memory on a card is *foreign* unless the
catalog has a live replica of that name on that card."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from agentclient.client import AgentCallFailed, AgentClient
from base.errors import DomainError
from catalog.models import Card, Node, Shard, live_replicas_q
from catalog.services.cards import card_cordon
from telemetry.models import CardReading, CardSample, NodeReading

log = logging.getLogger("telemetry")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def telemetry_record(*, node: Node, body: dict[str, Any]) -> list[CardReading]:
    """Keep what ``node``'s agent answered: the cards' latest readings (replaced), a sample each
    (older ones past the history dropped), and the node's last answer."""
    now = timezone.now()
    cards = {c.index: c for c in Card.objects.filter(node=node)}
    known: dict[int, set[str]] = {}
    for index, name in Shard.objects.filter(live_replicas_q("replica__"), card__node=node).values_list(
        "card__index", "replica__name"
    ):
        known.setdefault(index, set()).add(name)
    readings = []
    failing: dict[int, int] = {}  # card index: uncorrected ECC errors its agent reports
    for raw in body.get("cards") or []:
        at = raw.get("index") if isinstance(raw, dict) else None
        card = cards.get(at) if isinstance(at, int) else None
        if card is None:
            continue  # a card the catalog does not list: nothing to attach it to
        ecc = _int(raw.get("ecc_uncorrected"))
        if ecc and not card.cordoned:
            failing[card.index] = ecc
        processes = []
        for p in raw.get("processes") or []:
            if not isinstance(p, dict):
                continue
            replica = p.get("replica") if isinstance(p.get("replica"), str) else None
            processes.append(
                {
                    "pid": _int(p.get("pid")),
                    "used_mib": _int(p.get("used_mib")),
                    "name": str(p.get("name") or "")[:120],
                    "replica": replica,
                    "foreign": replica is None or replica not in known.get(card.index, set()),
                }
            )
        readings.append(
            CardReading(
                card=card,
                at=now,
                memory_used_mib=_int(raw.get("memory_used_mib")),
                memory_total_mib=_int(raw.get("memory_total_mib")),
                utilization_percent=_int(raw.get("utilization_percent")),
                temperature_c=raw.get("temperature_c") if isinstance(raw.get("temperature_c"), int) else None,
                processes=processes,
                foreign_mib=sum(p["used_mib"] or 0 for p in processes if p["foreign"]),
            )
        )
    history = timedelta(seconds=settings.LLMGW_TELEMETRY_HISTORY_SECONDS)
    with transaction.atomic():
        CardReading.objects.bulk_create(
            readings,
            update_conflicts=True,
            unique_fields=["card"],
            update_fields=[
                "at",
                "memory_used_mib",
                "memory_total_mib",
                "utilization_percent",
                "temperature_c",
                "processes",
                "foreign_mib",
            ],
        )
        CardSample.objects.bulk_create(
            CardSample(
                card=r.card,
                at=now,
                memory_used_mib=r.memory_used_mib,
                utilization_percent=r.utilization_percent,
                temperature_c=r.temperature_c,
                foreign_mib=r.foreign_mib,
            )
            for r in readings
        )
        CardSample.objects.filter(card__node=node, at__lt=now - history).delete()
        NodeReading.objects.update_or_create(
            node=node,
            defaults={
                "seen_at": now,
                "asked_at": now,
                "error": "",
                "source": str(body.get("source", ""))[:32],
            },
        )
    for index, errors in sorted(failing.items()):
        _cordon_failing(node, index, errors)
    return readings


def _cordon_failing(node: Node, index: int, errors: int) -> None:
    """A card whose agent reports uncorrected ECC errors takes no new replica: cordoned (audited, as
    whoever samples: the worker or the command), what runs on it left running."""
    try:
        card_cordon(
            node_name=node.name,
            index=index,
            reason=f"{errors} uncorrected ECC error{'s' if errors != 1 else ''} since its driver loaded "
            "(nvidia-smi), seen by the telemetry",
        )
    except DomainError as err:  # cordoned meanwhile by another sampler or an operator
        log.info("card %s of %s not cordoned by the telemetry: %s", index, node.name, err.message)
    else:
        log.warning("card %s of %s cordoned: %s uncorrected ECC errors", index, node.name, errors)


def node_sample(node: Node) -> bool:
    """Ask ``node``'s agent for its telemetry and keep it; False (its error kept) when it did not answer."""
    try:
        body = AgentClient.for_node(node).telemetry()
    except AgentCallFailed as exc:
        NodeReading.objects.update_or_create(
            node=node, defaults={"asked_at": timezone.now(), "error": exc.message[:1000]}
        )
        return False
    telemetry_record(node=node, body=body if isinstance(body, dict) else {})
    return True


def fleet_sample(nodes: Iterable[Node] | None = None, *, parallel: int = 8) -> dict[str, bool]:
    """Sample every node (or those given), ``parallel`` at a time: whether each answered."""
    chosen = list(nodes if nodes is not None else Node.objects.order_by("name"))

    def one(node: Node) -> bool:
        try:
            return node_sample(node)
        finally:
            if parallel > 1:
                connection.close()  # the thread's own connection

    if parallel <= 1 or connection.vendor == "sqlite":
        return {n.name: node_sample(n) for n in chosen}
    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="telemetry") as pool:
        return dict(zip((n.name for n in chosen), pool.map(one, chosen), strict=True))
