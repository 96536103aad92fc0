"""Reads that need care: restart operations, and the fleet as a change plans and places on it
(the catalog's cards with the telemetry's word on which a foreign process holds)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from django.db.models import Prefetch, QuerySet

from catalog.models import Card, GPUClass, Node, Profile, Replica, restartable_replicas_q
from catalog.selectors import node_facts
from operations.models import RestartOperation, RestartStep
from planning import NodeRoom
from planning.checks import Fleet
from planning.placement import LiveReplica, NodeCards, RankPlace
from planning.releases import NodeFacts
from telemetry.selectors import foreign_held_card_ids
from versions.cache import kept_here


def operations_with_steps() -> QuerySet[RestartOperation]:
    """Operations with their model, profile and steps, each step with its two
    replicas, in two queries however many steps there are."""
    steps = RestartStep.objects.select_related("old_replica", "new_replica").order_by("id")
    return RestartOperation.objects.select_related("model", "profile").prefetch_related(
        Prefetch("steps", queryset=steps)
    )


@dataclass(frozen=True)
class FleetCards:
    """The fleet's cards as every change plans on them, apart from any model: read whole once per
    version of the fleet and the placement (and set of cards a foreign process holds), then shared by
    every dry run, preview and restart plan until one of them changes (``fleet_cards``). Nobody
    writes into it: its mappings are read only."""

    nodes: Mapping[int, tuple[str, bool]]  # id: name, and whether a change may use it (ready, answering)
    facts: Mapping[str, NodeFacts]  # by node name: what its agent reported
    fabric: Mapping[str, str]  # by node name: its fabric domain
    classes: Mapping[int, str]  # GPU class id: name
    # One room a node and class, held by nobody being changed (``own`` 0), by node and class name; and
    # where each (node id, class id) is in it.
    rooms: tuple[NodeRoom, ...]
    room_at: Mapping[tuple[int, int], int]
    # Each replica's cards: rank, node name, class name, index, cordoned (on its own), node id, class id.
    held: Mapping[int, tuple[tuple[int, str, str, int, bool, int, int], ...]]
    by_class: Mapping[int, tuple[NodeCards, ...]]  # each class's cards on every node that has some


def fleet_cards() -> FleetCards:
    """The fleet's cards (``FleetCards``), kept in this process under the fleet's and the placement's
    versions and the cards a foreign process holds now (one query: the only telemetry read, and the
    part the clock changes as readings age): a replica's state or a model's edit reads none of them
    again. Four queries when read, whatever the size of the fleet."""
    foreign = foreign_held_card_ids()
    return kept_here(
        "fleet-cards", ["fleet", "placement"], [sorted(foreign)], lambda: _read_fleet_cards(foreign)
    )


def _read_fleet_cards(foreign: set[int]) -> FleetCards:
    """Every card as a tuple of ids (node, class, index, holder), the names looked up once: at 8,000
    cards a row per card carrying its node's, class's and holder's names as a dict cost more than all
    the rest of a dry run."""
    # A node is used only when the operator has it ready and its agent answers (the reconciler says).
    nodes: dict[int, tuple[str, bool]] = {}
    facts = {}
    fabric: dict[str, str] = {}  # each node's fabric domain, by name: a group spans one
    for row in Node.objects.only(*NODE_FIELDS):
        nodes[row.pk] = (row.name, row.state == "ready" and row.reachable)
        facts[row.name] = node_facts(row)
        fabric[row.name] = row.fabric_domain
    classes = dict(GPUClass.objects.values_list("id", "name"))
    counts: dict[tuple[int, int], list[int]] = {}  # cards, free
    by_node: dict[int, dict[int, tuple[list[int], list[int]]]] = {}  # class: node: its indices, the free
    held: dict[int, list[tuple[int, str, str, int, bool, int, int]]] = {}
    # A card a process the catalog does not know holds memory on is not free, whatever the catalog says.
    # A card cordoned on its own (card_cordon) takes no replacement: neither free nor room in place.
    for card_id, node, cls, index, holder, rank, cordoned in Card.objects.values_list(
        "id", "node_id", "gpu_class_id", "index", "shard__replica_id", "shard__rank", "cordoned"
    ).order_by("index"):
        count = counts.setdefault((node, cls), [0, 0])
        count[0] += 1
        free = holder is None and card_id not in foreign and not cordoned
        count[1] += free
        if holder is not None:
            held.setdefault(holder, []).append(
                (rank or 0, nodes[node][0], classes[cls], index, cordoned, node, cls)
            )
        indices, free_ones = by_node.setdefault(cls, {}).setdefault(node, ([], []))
        indices.append(index)
        if free:
            free_ones.append(index)
    keys = sorted(counts, key=lambda k: (nodes[k[0]][0], classes[k[1]]))
    rooms = tuple(
        NodeRoom(
            node=nodes[node][0],
            ready=nodes[node][1],
            gpu_class=classes[cls],
            cards=counts[(node, cls)][0],
            free=counts[(node, cls)][1],
            own=0,
            fabric=fabric[nodes[node][0]],
        )
        for node, cls in keys
    )
    by_class = {
        cls: tuple(
            NodeCards(node=name, ready=ready, indices=tuple(indices), free=tuple(free), fabric=fabric[name])
            for (name, ready), (indices, free) in sorted(
                ((nodes[pk], cards) for pk, cards in on_nodes.items()), key=lambda pair: pair[0][0]
            )
        )
        for cls, on_nodes in by_node.items()
    }
    return FleetCards(
        nodes=MappingProxyType(nodes),
        facts=MappingProxyType(facts),
        fabric=MappingProxyType(fabric),
        classes=MappingProxyType(classes),
        rooms=rooms,
        room_at=MappingProxyType({k: i for i, k in enumerate(keys)}),
        held=MappingProxyType({k: tuple(v) for k, v in held.items()}),
        by_class=MappingProxyType(by_class),
    )


NODE_FIELDS = (
    "id",
    "name",
    "state",
    "reachable",
    "driver_version",
    "cuda_version",
    "arch",
    "engines",
    "facts_at",
    "fabric_domain",
)


def rooms_and_fleet(profile: Profile | None, *, parallel: int = 1) -> tuple[list[NodeRoom], Fleet | None]:
    """``node_rooms(profile)`` and what the restart simulation reads for ``profile`` (its class's cards
    on every node, which are free, and the model's live (and unknown) replicas with where they run,
    those of ``profile`` marked as the ones restarted): the fleet's cards as ``fleet_cards`` keeps them,
    with the model's live replicas read (one query) and laid over them."""
    cards = fleet_cards()
    model_live: dict[int, tuple[str, bool]] = {}  # the model's live replicas: name, and whether restarted
    if profile is not None:
        model_live = {
            pk: (name, profile_id == profile.pk)
            # Unknown ones too (their node's agent does not answer): they may run, and a restart takes them.
            for pk, name, profile_id in Replica.objects.filter(
                restartable_replicas_q(), profile__model_id=profile.model_id
            ).values_list("id", "name", "profile_id")
        }
    own: dict[int, int] = {}  # held by the profile's live replicas, not cordoned: by place in the rooms
    held: list[
        tuple[int, str, str, int, int]
    ] = []  # the model's live replicas' cards: rank, node, class, index, replica
    cordoned_held: dict[int, set[tuple[str, int]]] = {}  # the live replicas' cordoned cards: node, index
    for holder, (_, restarted) in model_live.items():
        for rank, node_name, cls_name, index, cordoned, node, cls in cards.held.get(holder, ()):
            held.append((rank, node_name, cls_name, index, holder))
            if cordoned:
                cordoned_held.setdefault(holder, set()).add((node_name, index))
            elif restarted:
                at = cards.room_at[(node, cls)]
                own[at] = own.get(at, 0) + 1
    rooms = list(cards.rooms)
    for at, n in own.items():
        rooms[at] = replace(rooms[at], own=n)
    if profile is None or profile.gpu_class_id is None:
        return rooms, None
    # Where each live replica runs: each rank's node and its cards there, rank 0 first (its node
    # and cards are the replica's own); a rank's node is the first of its cards', by name.
    spots: dict[int, dict[int, tuple[str, list[int]]]] = {}
    for rank, node_name, _, index, holder in sorted(held):
        node_of, on_node = spots.setdefault(holder, {}).setdefault(rank, (node_name, []))
        if node_name == node_of:
            on_node.append(index)
    fleet = Fleet(
        cards=cards.by_class.get(profile.gpu_class_id, ()),
        replicas=tuple(
            _live_replica(model_live[pk], ranks, cordoned_held.get(pk, set())) for pk, ranks in spots.items()
        ),
        parallel=parallel,
        facts=cards.facts,
    )
    return rooms, fleet


def _live_replica(
    live: tuple[str, bool], ranks: dict[int, tuple[str, list[int]]], cordoned: set[tuple[str, int]]
) -> LiveReplica:
    """A live replica as the restart simulation reads it: rank 0's node and cards (the lowest rank
    held), every rank's, and its cordoned cards on rank 0's node."""
    places = tuple(
        RankPlace(rank, node, tuple(sorted(cards))) for rank, (node, cards) in sorted(ranks.items())
    )
    first = places[0]
    return LiveReplica(
        name=live[0],
        node=first.node,
        cards=first.cards,
        restarted=live[1],
        cordoned=tuple(sorted(i for n, i in cordoned if n == first.node)),
        ranks=places if len(places) > 1 else (),
    )
