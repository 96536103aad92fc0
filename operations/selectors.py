"""Reads that need care: restart operations, and the fleet as a change plans and places on it
(the catalog's cards with the telemetry's word on which a foreign process holds)."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from catalog.models import Card, GPUClass, Node, Profile, Replica, restartable_replicas_q
from catalog.selectors import node_facts
from operations.models import RestartOperation, RestartStep
from planning import NodeRoom
from planning.checks import Fleet
from planning.placement import LiveReplica, NodeCards, RankPlace
from telemetry.selectors import foreign_held_card_ids


def operations_with_steps() -> QuerySet[RestartOperation]:
    """Operations with their model, profile and steps, each step with its two
    replicas, in two queries however many steps there are."""
    steps = RestartStep.objects.select_related("old_replica", "new_replica").order_by("id")
    return RestartOperation.objects.select_related("model", "profile").prefetch_related(
        Prefetch("steps", queryset=steps)
    )


def rooms_and_fleet(profile: Profile | None, *, parallel: int = 1) -> tuple[list[NodeRoom], Fleet | None]:
    """``node_rooms(profile)`` and what the restart simulation reads for
    ``profile`` (its class's cards on every node, which are free, and the
    model's live (and unknown) replicas with where they run, those of ``profile`` marked as
    the ones restarted), in four queries whatever the size of the fleet.

    Every card comes as a tuple of ids (node, class, index, holder), the names
    looked up once: at 8,000 cards a row per card carrying its node's, class's
    and holder's names as a dict cost more than all the rest of a dry run.
    """
    # A node is used only when the operator has it ready and its agent answers (the reconciler says).
    nodes = {}
    facts = {}
    fabric: dict[str, str] = {}  # each node's fabric domain, by name: a group spans one
    for row in Node.objects.only(
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
    ):
        nodes[row.pk] = (row.name, row.state == "ready" and row.reachable)
        facts[row.name] = node_facts(row)
        fabric[row.name] = row.fabric_domain
    classes = dict(GPUClass.objects.values_list("id", "name"))
    model_live: dict[int, tuple[str, bool]] = {}  # the model's live replicas: name, and whether restarted
    if profile is not None:
        model_live = {
            pk: (name, profile_id == profile.pk)
            # Unknown ones too (their node's agent does not answer): they may run, and a restart takes them.
            for pk, name, profile_id in Replica.objects.filter(
                restartable_replicas_q(), profile__model_id=profile.model_id
            ).values_list("id", "name", "profile_id")
        }
    restarted_class = profile.gpu_class_id if profile is not None else None
    counts: dict[tuple[int, int], list[int]] = {}  # cards, free, held by the profile's live replicas
    by_node: dict[int, tuple[list[int], list[int]]] = {}  # the class's card indices on a node, and the free
    held: list[
        tuple[int, str, str, int, int]
    ] = []  # the model's live replicas' cards: rank, node, class, index, replica
    # A card a process the catalog does not know holds memory on is not free, whatever the catalog says.
    foreign = foreign_held_card_ids()
    cordoned_held: dict[int, set[tuple[str, int]]] = {}  # the live replicas' cordoned cards: node, index
    # A card cordoned on its own (card_cordon) takes no replacement: neither free nor room in place.
    for card_id, node, cls, index, holder, rank, cordoned in Card.objects.values_list(
        "id", "node_id", "gpu_class_id", "index", "shard__replica_id", "shard__rank", "cordoned"
    ).order_by("index"):
        count = counts.setdefault((node, cls), [0, 0, 0])
        count[0] += 1
        if holder is None and card_id not in foreign:
            count[1] += not cordoned
        elif holder in model_live:
            count[2] += model_live[holder][1] and not cordoned
            held.append((rank or 0, nodes[node][0], classes[cls], index, holder))
            if cordoned:
                cordoned_held.setdefault(holder, set()).add((nodes[node][0], index))
        if cls == restarted_class:
            indices, free = by_node.setdefault(node, ([], []))
            indices.append(index)
            if holder is None and card_id not in foreign and not cordoned:
                free.append(index)
    rooms = sorted(
        (
            NodeRoom(
                node=nodes[node][0],
                ready=nodes[node][1],
                gpu_class=classes[cls],
                cards=n,
                free=free_n,
                own=own_n,
                fabric=fabric[nodes[node][0]],
            )
            for (node, cls), (n, free_n, own_n) in counts.items()
        ),
        key=lambda room: (room.node, room.gpu_class),
    )
    if profile is None or profile.gpu_class_id is None:
        return rooms, None
    # Where each live replica runs: each rank's node and its cards there, rank 0 first (its node
    # and cards are the replica's own); a rank's node is the first of its cards', by name.
    spots: dict[int, dict[int, tuple[str, list[int]]]] = {}
    for rank, node_name, _, index, holder in sorted(held):
        node_of, cards = spots.setdefault(holder, {}).setdefault(rank, (node_name, []))
        if node_name == node_of:
            cards.append(index)
    fleet = Fleet(
        cards=tuple(
            NodeCards(node=name, ready=ready, indices=tuple(indices), free=tuple(free), fabric=fabric[name])
            for (name, ready), (indices, free) in sorted(
                ((nodes[pk], cards) for pk, cards in by_node.items()), key=lambda pair: pair[0][0]
            )
        ),
        replicas=tuple(
            _live_replica(model_live[pk], ranks, cordoned_held.get(pk, set())) for pk, ranks in spots.items()
        ),
        parallel=parallel,
        facts=facts,
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
