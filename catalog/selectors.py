"""Reads that need care: the catalog as the planner sees it, in a fixed number of queries."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, NamedTuple

from django.conf import settings
from django.db.models import Count, Q, QuerySet

from catalog.models import (
    Card,
    EngineDefault,
    GPUClass,
    Node,
    Profile,
    Replica,
    ServedModel,
    live_replicas_q,
)
from planning import GPUClassSpec, ModelSpec, NodeRoom, ProfileSpec, Shape
from planning.releases import NodeFacts
from planning.types import SHAPE_FIELDS, TEXT_SHAPE_FIELDS


def shape_of(model: ServedModel) -> Shape:
    values = {f: getattr(model, f) for f in SHAPE_FIELDS}
    # The model keeps an unknown text as "", the planner as None.
    values.update({f: values[f] or None for f in TEXT_SHAPE_FIELDS})
    return Shape(context_length=model.context_length, **values)


def engine_defaults() -> dict[str, str]:
    """The fleet's default release of each engine that has one (``EngineDefault``)."""
    return dict(EngineDefault.objects.values_list("engine", "version"))


def release_of(profile: Profile, defaults: dict[str, str] | None = None) -> str:
    """The release ``profile`` runs: its own, else the fleet's default of its engine ("" when
    neither is set). Pass ``defaults`` (``engine_defaults()``) when reading many."""
    if profile.engine_version:
        return profile.engine_version
    if defaults is None:
        defaults = engine_defaults()
    return defaults.get(profile.engine, "")


def node_facts(node: Node) -> NodeFacts:
    """What ``node``'s agent reported of itself, for the planner (``known`` False: never)."""
    engines = node.engines if isinstance(node.engines, dict) else {}
    return NodeFacts(
        node=node.name,
        known=node.facts_at is not None,
        driver=node.driver_version,
        cuda=node.cuda_version,
        arch=node.arch,
        engines={str(k): str(v) for k, v in engines.items()},
    )


def profile_spec(profile: Profile, release: str | None = None) -> ProfileSpec:
    """The profile as the planner reads it; ``release`` is the release it runs (``release_of``), else
    its own (blank when it runs the fleet's default: pass ``release`` where the release matters, as the
    changes' plans do, so that a page of many profiles does not look the default up for each)."""
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
        engine_version=release if release is not None else profile.engine_version,
    )


def model_spec(
    model: ServedModel, profiles: list[Profile] | None = None, *, defaults: dict[str, str] | None = None
) -> ModelSpec:
    """The model with its profiles; pass ``profiles`` when already loaded, and ``defaults`` (the
    fleet's default releases, ``engine_defaults()``) where the releases matter (a change's plan):
    without, a profile on the fleet's default says no release."""
    if profiles is None:
        profiles = list(model.profiles.select_related("gpu_class").order_by("name"))
    return ModelSpec(
        name=model.name,
        context_length=model.context_length,
        declared=model.declared,
        # Where a declared model is changed: the file it was read from, else the settings file.
        declared_in=(model.declared_in or settings.LLMGW_CLUSTER_SETTINGS) if model.declared else None,
        shape=shape_of(model),
        profiles=tuple(
            profile_spec(p, release_of(p, defaults) if defaults is not None else None) for p in profiles
        ),
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
        Card.objects.values(
            "node__name", "node__state", "node__reachable", "node__fabric_domain", "gpu_class__name"
        )
        .annotate(
            cards=Count("id"), free=Count("id", filter=Q(shard__isnull=True)), own=Count("id", filter=own)
        )
        .order_by("node__name", "gpu_class__name")
    )
    return [
        NodeRoom(
            node=r["node__name"],
            ready=r["node__state"] == "ready" and r["node__reachable"],
            gpu_class=r["gpu_class__name"],
            cards=r["cards"],
            free=r["free"],
            own=r["own"],
            fabric=r["node__fabric_domain"],
        )
        for r in rows
    ]


def live_replicas(profile: Profile) -> QuerySet[Replica]:
    return Replica.objects.filter(live_replicas_q(), profile=profile)


# -- the nodes page: a summary of the whole fleet, and one page of nodes with their cards ---------------

# What one card row of ``cards_of`` holds, in this order (plain tuples: a page of 50 nodes is 400 of
# them, and building ORM objects for them cost more than the query).
CARD_ROW = (
    "node_id",
    "index",
    "gpu_class__name",
    "shard__replica__name",
    "shard__replica__state",
    "shard__replica__profile__model_id",
    "shard__replica__profile__model__name",
    "cordoned",
    "cordon_reason",
    # A replica across nodes: the rank that holds the card, and rank 0's rendezvous port (set only on
    # a group, so the grid numbers a group's ranks and nothing else).
    "shard__rank",
    "shard__replica__rendezvous_port",
)
# What the compact view reads of a card (it shows neither a card's class, its replica's state nor
# why it is cordoned): the others are given as None or "" (``compact_cards_of``).
COMPACT_CARD_ROW = (
    "node_id",
    "index",
    "shard__replica__name",
    "shard__replica__profile__model_id",
    "shard__replica__profile__model__name",
    "cordoned",
    "shard__rank",
    "shard__replica__rendezvous_port",
)
HOLDERS_NAMED = 8  # models named per class in the summary; the rest are counted together


class FleetCounts(NamedTuple):
    """What the nodes page's summary counts of the hardware and its placement, by ids: the cards by
    class and by the profile of the replica holding each (None: none), the classes' names and the
    nodes by state. Read under the fleet's and the placement's versions; which model each profile
    serves, and its name, are the models' (``holders_of``)."""

    cards: list[tuple[int, int | None, int]]  # (class id, holder's profile id, cards)
    classes: dict[int, str]
    states: dict[str, int]


def fleet_counts() -> FleetCounts:
    """Three queries, rows that grow with classes and profiles, not with cards: grouped by ids, the
    names looked up after (joining the class and model tables to 8,000 cards to group by their names
    cost as much as the grouping)."""
    cards = list(
        Card.objects.values_list("gpu_class_id", "shard__replica__profile_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    classes = dict(GPUClass.objects.values_list("id", "name"))
    states = dict(Node.objects.values_list("state").annotate(n=Count("id")).order_by("state"))
    return FleetCounts(cards, classes, states)


def holders_of() -> dict[int, tuple[int, str]]:
    """Each profile's model, by id and name: one query (a row a profile: fewer than the cards)."""
    return {
        pk: (model_id, name)
        for pk, model_id, name in Profile.objects.values_list("id", "model_id", "model__name")
    }


def fleet_summary(
    counts: FleetCounts | None = None, holders: dict[int, tuple[int, str]] | None = None
) -> dict[str, Any]:
    """Cards by class (in all, free, held by which models) and nodes by state: ``counts``
    (``fleet_counts``) with each holding profile's model (``holders_of``), read when not given."""
    counts = counts if counts is not None else fleet_counts()
    if holders is None:
        holders = holders_of()
    by_model: dict[tuple[str, str | None], int] = {}
    for cls, profile, n in counts.cards:
        model = holders[profile][1] if profile is not None and profile in holders else None
        key = (counts.classes[cls], model)
        by_model[key] = by_model.get(key, 0) + n
    rows = sorted(((c, m, n) for (c, m), n in by_model.items()), key=lambda r: (r[0], -r[2], r[1] or ""))
    classes: dict[str, dict[str, Any]] = {}
    for name, model, n in rows:
        c = classes.setdefault(
            name,
            {"name": name, "cards": 0, "free": 0, "held": 0, "holders": [], "others": 0, "others_cards": 0},
        )
        c["cards"] += n
        if model is None:
            c["free"] += n
            continue
        c["held"] += n
        if len(c["holders"]) < HOLDERS_NAMED:
            c["holders"].append((model, n))
        else:
            c["others"] += 1
            c["others_cards"] += n
    states = counts.states
    return {
        "classes": list(classes.values()),
        "states": [(s, states.get(s, 0)) for s in Node.State.values],
        "nodes": sum(states.values()),
        "cards": sum(c["cards"] for c in classes.values()),
        "free": sum(c["free"] for c in classes.values()),
    }


def nodes_matching(
    filters: dict[str, Any] | None = None, *, not_free: Collection[int] = ()
) -> QuerySet[Node]:
    """Nodes by name, narrowed by the nodes page's filters
    (class, state, at least so many free cards, holding cards of a model, part of the name).
    ``not_free``: ids of cards no replica holds that are not free all the same (a foreign process
    holds them: the telemetry says so, which the catalog does not read; its caller passes them)."""
    f = filters or {}
    qs = Node.objects.all()
    if name := f.get("name"):
        qs = qs.filter(name__icontains=name)
    if state := f.get("state"):
        qs = qs.filter(state=state)
    if cls := f.get("gpu_class"):
        qs = qs.filter(pk__in=Card.objects.filter(gpu_class__name=cls).values("node"))
    if model := f.get("model"):
        qs = qs.filter(pk__in=Card.objects.filter(shard__replica__profile__model__name=model).values("node"))
    if f.get("free") is not None:
        # Counted only when asked: the count joins every card, and the page reads its own anyway.
        # A card cordoned on its own is not free, nor one a foreign process holds.
        free = Q(cards__shard__isnull=True, cards__cordoned=False)
        if not_free:
            free &= ~Q(cards__id__in=list(not_free))
        qs = qs.annotate(free_count=Count("cards", filter=free)).filter(free_count__gte=f["free"])
    return qs.order_by("name")


def compact_cards_of(node_ids: list[int]) -> list[tuple]:
    """As ``cards_of``, with only what the compact view shows (``COMPACT_CARD_ROW``), the rest None or
    "": a compact page is 4,000 cards, and each column left out is 4,000 values not read. One query."""
    return [
        (node, index, None, replica, None, model_id, model, cordoned, "", rank, port)
        for node, index, replica, model_id, model, cordoned, rank, port in Card.objects.filter(
            node_id__in=node_ids
        )
        .order_by("node_id", "index")
        .values_list(*COMPACT_CARD_ROW)
    ]


def cards_of(node_ids: list[int], extra: tuple[str, ...] = ()) -> list[tuple]:
    """The cards of these nodes with their holders, as ``CARD_ROW`` tuples (then the ``extra``
    columns asked for, if any): one query."""
    return list(
        Card.objects.filter(node_id__in=node_ids).order_by("node_id", "index").values_list(*CARD_ROW, *extra)
    )
