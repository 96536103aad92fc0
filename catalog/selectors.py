"""Reads that need care: the catalog as the planner sees it, in a fixed number of queries."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Count, Q, QuerySet

from catalog.models import Card, GPUClass, Profile, Replica, ServedModel, live_replicas_q
from catalog.planning import GPUClassSpec, ModelSpec, NodeRoom, ProfileSpec, Shape
from catalog.planning.placement import LiveReplica, NodeCards
from catalog.planning.plan import Fleet
from catalog.planning.types import SHAPE_FIELDS


def shape_of(model: ServedModel) -> Shape:
    values = {f: getattr(model, f) for f in SHAPE_FIELDS}
    # The model keeps an unknown text as "", the planner as None.
    values.update(dtype=model.dtype or None, attention=model.attention or None)
    return Shape(context_length=model.context_length, **values)


def profile_spec(profile: Profile) -> ProfileSpec:
    return ProfileSpec(
        name=profile.name,
        engine=profile.engine,
        gpu_class=profile.gpu_class.name if profile.gpu_class is not None else None,
        gpus_per_node=profile.gpus_per_node,
        tp=profile.tp,
        nodes=profile.nodes,
        pp=profile.pp,
        args=tuple(profile.args),
        env=tuple(sorted(profile.env.items())),
    )


def model_spec(model: ServedModel, profiles: list[Profile] | None = None) -> ModelSpec:
    """The model with its profiles; pass ``profiles`` when already loaded."""
    if profiles is None:
        profiles = list(model.profiles.select_related("gpu_class").order_by("name"))
    return ModelSpec(
        name=model.name,
        context_length=model.context_length,
        declared=model.declared,
        # Where a declared model is changed: the file it was read from, else the settings file.
        declared_in=(model.declared_in or settings.LLMGW_CLUSTER_SETTINGS) if model.declared else None,
        shape=shape_of(model),
        profiles=tuple(profile_spec(p) for p in profiles),
        source=model.source,
    )


def gpu_class_specs() -> dict[str, GPUClassSpec]:
    return {
        c.name: GPUClassSpec(
            name=c.name,
            usable_bytes=c.usable_bytes,
            capability=c.compute_capability,
            total_bytes=c.memory_mib * 2**20,
        )
        for c in GPUClass.objects.all()
    }


def node_rooms(profile: Profile | None = None) -> list[NodeRoom]:
    """Each node's cards per class: how many, how many free, how many ``profile``'s live replicas hold.

    ``own`` counts only the replicas of the profile being changed: those are the ones an in-place
    restart stops, so only their cards come free (another profile's replicas of the same model keep
    theirs). One query, whatever the size of the fleet.
    """
    own = (
        Q(shard__replica__profile=profile) & live_replicas_q("shard__replica__")
        if profile is not None
        else Q(pk__in=[])
    )
    rows = (
        Card.objects.values("node__name", "node__state", "gpu_class__name")
        .annotate(
            cards=Count("id"), free=Count("id", filter=Q(shard__isnull=True)), own=Count("id", filter=own)
        )
        .order_by("node__name", "gpu_class__name")
    )
    return [
        NodeRoom(
            node=r["node__name"],
            ready=r["node__state"] == "ready",
            gpu_class=r["gpu_class__name"],
            cards=r["cards"],
            free=r["free"],
            own=r["own"],
        )
        for r in rows
    ]


def live_replicas(profile: Profile) -> QuerySet[Replica]:
    return Replica.objects.filter(profile=profile, state__in=Replica.LIVE_STATES)


def rooms_and_fleet(profile: Profile | None, *, parallel: int = 1) -> tuple[list[NodeRoom], Fleet | None]:
    """``node_rooms(profile)`` and what the restart simulation reads for
    ``profile`` (its class's cards on every node, which are free, and the
    model's live replicas with where they run, those of ``profile`` marked as
    the ones restarted), from one query whatever the size of the fleet."""
    rows = list(
        Card.objects.values(
            "node__name",
            "node__state",
            "gpu_class_id",
            "gpu_class__name",
            "index",
            "shard__replica__name",
            "shard__replica__state",
            "shard__replica__profile_id",
            "shard__replica__profile__model_id",
        ).order_by("node__name", "gpu_class__name", "index")
    )
    live = set(Replica.LIVE_STATES)
    counts: dict[tuple[str, str], list[Any]] = {}
    by_node: dict[str, tuple[bool, list[int], list[int]]] = {}
    spots: dict[str, tuple[str, list[int], bool]] = {}
    for r in rows:
        held = r["shard__replica__name"] is not None
        is_live = held and r["shard__replica__state"] in live
        mine = profile is not None and is_live and r["shard__replica__profile_id"] == profile.pk
        key = (r["node__name"], r["gpu_class__name"])
        count = counts.setdefault(key, [r["node__state"] == "ready", 0, 0, 0])
        count[1] += 1
        count[2] += 0 if held else 1
        count[3] += 1 if mine else 0
        if profile is None or profile.gpu_class_id is None:
            continue
        if r["gpu_class_id"] == profile.gpu_class_id:
            ready, indices, free = by_node.setdefault(r["node__name"], (r["node__state"] == "ready", [], []))
            indices.append(r["index"])
            if not held:
                free.append(r["index"])
        if is_live and r["shard__replica__profile__model_id"] == profile.model_id:
            node, held_cards, restarted = spots.setdefault(
                r["shard__replica__name"], (r["node__name"], [], mine)
            )
            if r["node__name"] == node:
                held_cards.append(r["index"])
    rooms = [
        NodeRoom(node=node, ready=ready, gpu_class=cls, cards=n, free=free_n, own=own)
        for (node, cls), (ready, n, free_n, own) in counts.items()
    ]
    if profile is None or profile.gpu_class_id is None:
        return rooms, None
    fleet = Fleet(
        cards=tuple(
            NodeCards(node=name, ready=ready, indices=tuple(indices), free=tuple(free))
            for name, (ready, indices, free) in by_node.items()
        ),
        replicas=tuple(
            LiveReplica(name=name, node=node, cards=tuple(sorted(cards)), restarted=restarted)
            for name, (node, cards, restarted) in spots.items()
        ),
        parallel=parallel,
    )
    return rooms, fleet
