"""Where a replacement runs: its node, its cards and its port.

Rolling, the replacement goes on free cards beside the replica it replaces
(best fit, on a node that holds none of the model's other live replicas
first); in place, on the old replica's cards once it is stopped. A replica
across nodes (a profile with ``nodes > 1``) goes on whole nodes of one fabric
domain, a rank a node (``group_best_fit``). Ports are the highest in use (a
serving or a rendezvous port) on the node's host + 1, from
``LLMGW_REPLICA_PORT_BASE``; a group's two are free on every host it touches
(``group_ports``).
Placements are made one transaction at a time (``lock_placement``, held to the
commit), so two steps never pick the same cards or port; a run's rolling placements
asked meanwhile are made together in one such transaction (``runner/placing.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from django.conf import settings
from django.db.models import Max

from base.db import hold_lock
from base.errors import DomainError
from catalog.models import Card, Node, Profile, Replica, ServedModel, Shard, live_replicas_q
from catalog.selectors import node_facts, release_of
from operations.models import RestartStep
from planning import engine
from planning.placement import best_fit_key, pick_group
from planning.releases import floor_of, node_refusal
from telemetry.selectors import foreign_held_card_ids

_PLACEMENT_LOCK_KEY = 0x6C6C7270  # "llrp"


def lock_placement() -> None:
    """One placement at a time, until the transaction ends."""
    hold_lock(_PLACEMENT_LOCK_KEY)


def replica_placement(replica: Replica) -> tuple[Node | None, list[int]]:
    """The node a replica runs on and its card indices there (None, [] when it holds no cards);
    rank 0's for a replica across nodes (``replica_ranks``: every rank's)."""
    shards = list(
        Shard.objects.filter(replica=replica).select_related("card__node").order_by("rank", "card__index")
    )
    if not shards:
        return None, []
    node = shards[0].card.node
    return node, [s.card.index for s in shards if s.card.node_id == node.pk]


def replica_ranks(replica: Replica) -> list[tuple[int, Node, list[int]]]:
    """Each rank of a replica with its node and card indices there, rank 0 first (one rank on one node)."""
    ranks: dict[int, tuple[Node, list[int]]] = {}
    for shard in (
        Shard.objects.filter(replica=replica).select_related("card__node").order_by("rank", "card__index")
    ):
        ranks.setdefault(shard.rank, (shard.card.node, []))[1].append(shard.card.index)
    return [(rank, node, cards) for rank, (node, cards) in sorted(ranks.items())]


def node_hosts() -> dict[int, str]:
    """Each node's agent's host, by node id (one query, no token decrypted): nodes whose agents
    share a host (the demo, the tests) share its ports."""
    return {pk: Node(agent_url=url).agent_host for pk, url in Node.objects.values_list("pk", "agent_url")}


def free_port(node: Node, *, after: int | None = None, hosts: dict[int, str] | None = None) -> int:
    """The highest port live replicas use on the node's host, + 1 (from the base),
    and above ``after`` when given (a port found taken by another program).

    Nodes whose agents share a host (the demo, the tests) share its ports: ``hosts``
    (``node_hosts``), when the caller read them before the placement lock.
    """
    return _free_port_on([node], after=after, hosts=hosts)


def group_ports(
    nodes: list[Node], *, after: int | None = None, hosts: dict[int, str] | None = None
) -> tuple[int, int]:
    """A group's serving port (rank 0's) and its rendezvous port, each free on every host of
    ``nodes`` (one number per replica, reserved on all its hosts): above the highest port any live
    replica holds on any of them, and above ``after`` when given (a port found taken)."""
    port = _free_port_on(nodes, after=after, hosts=hosts)
    return port, port + 1


def _free_port_on(nodes: list[Node], *, after: int | None, hosts: dict[int, str] | None) -> int:
    hosts = node_hosts() if hosts is None else hosts
    wanted = {node.agent_host for node in nodes}
    same_host = [pk for pk, host in hosts.items() if host in wanted]
    # Replicas whose end is not confirmed may still hold their ports: not reused. A group's
    # rendezvous port is held on every host it touches, as its serving port is.
    top = Replica.objects.filter(
        state__in=Replica.HOLDING_STATES, shards__card__node__in=same_host
    ).aggregate(port=Max("port"), rendezvous=Max("rendezvous_port"))
    highest = max((v for v in top.values() if v is not None), default=None)
    base = settings.LLMGW_REPLICA_PORT_BASE
    port = base if highest is None or highest < base else highest + 1
    return port if after is None else max(port, after + 1)


def release_refusal(profile: Profile, node: Node, *, release: str | None = None) -> DomainError | None:
    """Why ``node`` cannot run ``profile``'s engine release: a floor of the release its agent's facts
    fail (``capability``, ``driver``, ``cuda``, ``arch``) or the release not installed there
    (``release_missing``); None when it can, or when its agent never reported (the restart's plan
    says so). The one check the restart's plan (``planning.plan``) and its run share. ``release``:
    the profile's (``release_of``), when the caller read it already (before a lock)."""
    try:
        eng = engine(profile.engine)
    except DomainError:
        return None
    release = release_of(profile) if release is None else release
    capability = profile.gpu_class.compute_capability if profile.gpu_class is not None else ""
    return node_refusal(
        eng.name, release, floor_of(eng.floors, release), node_facts(node), capability=capability
    )


def release_refusals(profile: Profile) -> list[str]:
    """A sentence for each ready node with the profile's class of card that cannot run its release."""
    nodes = Node.objects.filter(
        state=Node.State.READY, reachable=True, cards__gpu_class_id=profile.gpu_class_id
    ).distinct()
    return [err.message for node in nodes if (err := release_refusal(profile, node)) is not None]


def best_fit(profile: Profile, *, replacing: Replica | None = None) -> tuple[Node, list[Card]] | None:
    """Free cards of the profile's class for one replica: on the ready node
    whose agent answers (not cordoned, not down, not unreachable) that comes
    first by ``planning.placement.best_fit_key``, the order the restart's plan
    uses: one holding none of the model's other live replicas, then the fewest
    free cards that still fit, then the name. A card cordoned on its own is passed over."""
    need = profile.cards
    siblings = set(
        Shard.objects.filter(live_replicas_q("replica__"), replica__profile__model_id=profile.model_id)
        .exclude(replica=replacing)
        .values_list("card__node_id", flat=True)
    )
    fits = [cards for cards in _free_cards(profile).values() if len(cards) >= need]
    if not fits:
        return None
    best = min(
        fits, key=lambda cards: best_fit_key(cards[0].node_id in siblings, len(cards), cards[0].node.name)
    )
    return best[0].node, best[:need]


def _free_cards(profile: Profile) -> dict[int, list[Card]]:
    """The free cards of the profile's class by node id, on the nodes that may take a replica of
    it: ready, answering, able to run its release; no card cordoned, held by a foreign process or
    by an orphan engine. In node name and card index order."""
    free: dict[int, list[Card]] = {}
    refused: set[int] = set()
    for card in (
        Card.objects.filter(
            gpu_class_id=profile.gpu_class_id,
            node__state=Node.State.READY,
            node__reachable=True,
            shard__isnull=True,
            cordoned=False,  # a card cordoned on its own (card_cordon)
        )
        .exclude(pk__in=foreign_held_card_ids())  # held by a process the catalog does not know
        .select_related("node")
        .order_by("node__name", "index")
    ):
        if card.index in orphan_cards(card.node):
            continue  # an engine the catalog does not hold runs there (the reconciler listed it)
        if card.node_id not in free and card.node_id in refused:
            continue
        if card.node_id not in free and release_refusal(profile, card.node) is not None:
            refused.add(card.node_id)  # the release's floors, or the release not installed there
            continue
        free.setdefault(card.node_id, []).append(card)
    return free


def group_best_fit(
    profile: Profile, *, replacing: Replica | None = None
) -> list[tuple[int, Node, list[Card]]] | None:
    """Free cards for one replica across ``profile.nodes`` nodes: a rank a node, each on
    ``profile.cards // profile.nodes`` free cards of the profile's class, the nodes all of one
    fabric domain (a node whose domain is blank joins no group), ready, answering, able to run the
    profile's release (so one release on all of them), as ``best_fit`` reads them; chosen by
    ``planning.placement.pick_group``, the rule the restart's plan uses. Each rank with its node and
    cards, rank 0 first; None when no domain has room."""
    ranks = max(profile.nodes, 1)
    per_node = profile.cards // ranks
    siblings = set(
        Shard.objects.filter(live_replicas_q("replica__"), replica__profile__model_id=profile.model_id)
        .exclude(replica=replacing)
        .values_list("card__node__name", flat=True)
    )
    free = _free_cards(profile)
    by_name = {cards[0].node.name: cards for cards in free.values()}
    chosen = pick_group(
        {name: [c.index for c in cards] for name, cards in by_name.items()},
        {name: cards[0].node.fabric_domain for name, cards in by_name.items()},
        per_node,
        ranks,
        siblings=siblings,
    )
    if chosen is None:
        return None
    out = []
    for place in chosen:
        cards = {c.index: c for c in by_name[place.node]}
        out.append((place.rank, cards[place.cards[0]].node, [cards[i] for i in place.cards]))
    return out


def orphan_cards(node: Node) -> set[int]:
    """The cards of ``node`` its agent's orphans run on (``Node.orphans``): free in the catalog, not on the node."""
    return {int(i) for o in node.orphans or [] for i in o.get("cards") or [] if isinstance(i, int)}


def replica_name(model: ServedModel, step: RestartStep | None = None, *, locked: bool = False) -> str:
    """The model's next replica name, counted per model: ``<model>-<n>``, n one more than the
    highest any of its replicas has (stopped ones included, so a name is never reused). Takes
    the placement lock (``locked``: the caller's transaction holds it already), so two steps of
    one model never pick the same n.

    The names read are every replica's that starts with ``<model>-``, another model's too (a model
    named ``<model>-2`` has replicas ``<model>-2-<n>``; a replica named by hand may be
    ``<model>-<n>``): n is above every number among them, so ``<model>-<n>`` is nobody's, with no
    query to check it."""
    if not locked:
        lock_placement()
    return next(replica_names(model))


def replica_names(model: ServedModel) -> Iterator[str]:
    """The model's next replica names, in turn (``replica_name``'s, read once, then counted on):
    for placements made together under the placement lock the caller's transaction holds."""
    prefix = f"{model.name}-"
    tails = [
        int(tail)
        for name in Replica.objects.filter(name__startswith=prefix).values_list("name", flat=True)
        if (tail := name[len(prefix) :]).isdigit()
    ]
    return (f"{prefix}{n}" for n in itertools.count(max(tails, default=0) + 1))


def in_place_cards(profile: Profile, old: Replica, node: Node) -> list[int] | str:
    """The cards of ``old``'s node the replacement will use once ``old`` is
    stopped: its own cards first, then free ones (none a foreign process holds, none cordoned); a
    sentence when too few."""
    need = profile.cards
    usable = (
        Card.objects.filter(node=node, gpu_class_id=profile.gpu_class_id, cordoned=False)
        .exclude(pk__in=foreign_held_card_ids())
        .order_by("index")
    )
    refusal = release_refusal(profile, node)
    if refusal is not None:
        return f"In place on {node.name} is refused: {refusal.message}"
    own = list(usable.filter(shard__replica=old).values_list("index", flat=True))
    free = list(usable.filter(shard__isnull=True).values_list("index", flat=True))
    if len(own) + len(free) < need:
        return (
            f"In place needs {need} card(s) of class {profile.gpu_class} on {node.name}, and it has only "
            f"{len(own) + len(free)} with {old.name}'s freed; no node has room beside either."
        )
    return sorted((own + free)[:need])
