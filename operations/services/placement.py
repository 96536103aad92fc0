"""Where a replacement runs: its node, its cards and its port.

Rolling, the replacement goes on free cards beside the replica it replaces
(best fit, on a node that holds none of the model's other live replicas
first); in place, on the old replica's cards once it is stopped. Ports are
the highest in use on the node's host + 1, from ``LLMGW_REPLICA_PORT_BASE``.
Placements are made one at a time (``lock_placement``), so two steps never
pick the same cards or port.
"""

from __future__ import annotations

from django.conf import settings
from django.db.models import Max

from base.db import hold_lock
from base.errors import DomainError
from catalog.models import Card, Node, Profile, Replica, ServedModel, Shard, live_replicas_q
from catalog.selectors import node_facts, release_of
from operations.models import RestartStep
from planning import engine
from planning.placement import best_fit_key
from planning.releases import floor_of, node_refusal
from telemetry.selectors import foreign_held_card_ids

_PLACEMENT_LOCK_KEY = 0x6C6C7270  # "llrp"


def lock_placement() -> None:
    """One placement at a time, until the transaction ends."""
    hold_lock(_PLACEMENT_LOCK_KEY)


def replica_placement(replica: Replica) -> tuple[Node | None, list[int]]:
    """The node a replica runs on and its card indices there (None, [] when it holds no cards)."""
    shards = list(Shard.objects.filter(replica=replica).select_related("card__node").order_by("card__index"))
    if not shards:
        return None, []
    node = shards[0].card.node
    return node, [s.card.index for s in shards if s.card.node_id == node.pk]


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
    hosts = node_hosts() if hosts is None else hosts
    same_host = [pk for pk, host in hosts.items() if host == node.agent_host]
    # Replicas whose end is not confirmed may still hold their port: not reused.
    highest = Replica.objects.filter(
        state__in=Replica.HOLDING_STATES, shards__card__node__in=same_host
    ).aggregate(top=Max("port"))["top"]
    base = settings.LLMGW_REPLICA_PORT_BASE
    port = base if highest is None or highest < base else highest + 1
    return port if after is None else max(port, after + 1)


def release_refusal(profile: Profile, node: Node) -> DomainError | None:
    """Why ``node`` cannot run ``profile``'s engine release: a floor of the release its agent's facts
    fail (``capability``, ``driver``, ``cuda``, ``arch``) or the release not installed there
    (``release_missing``); None when it can, or when its agent never reported (the restart's plan
    says so). The one check the restart's plan (``planning.plan``) and its run share."""
    try:
        eng = engine(profile.engine)
    except DomainError:
        return None
    release = release_of(profile)
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
    fits = [cards for cards in free.values() if len(cards) >= need]
    if not fits:
        return None
    best = min(
        fits, key=lambda cards: best_fit_key(cards[0].node_id in siblings, len(cards), cards[0].node.name)
    )
    return best[0].node, best[:need]


def orphan_cards(node: Node) -> set[int]:
    """The cards of ``node`` its agent's orphans run on (``Node.orphans``): free in the catalog, not on the node."""
    return {int(i) for o in node.orphans or [] for i in o.get("cards") or [] if isinstance(i, int)}


def replica_name(model: ServedModel, step: RestartStep | None = None) -> str:
    """The model's next replica name, counted per model: ``<model>-<n>``, n one more than the
    highest any of its replicas has (stopped ones included, so a name is never reused). Takes
    the placement lock, so two steps of one model never pick the same n."""
    lock_placement()
    prefix = f"{model.name}-"
    highest = 0
    for name in Replica.objects.filter(name__startswith=prefix).values_list("name", flat=True):
        tail = name[len(prefix) :]
        if tail.isdigit():
            highest = max(highest, int(tail))
    n = highest + 1
    while Replica.objects.filter(name=f"{prefix}{n}").exists():  # another model named like ours
        n += 1
    return f"{prefix}{n}"


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
