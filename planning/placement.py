"""The whole restart, simulated before it starts: where each replica of the
profile goes, in the order the restart takes them.

The restart (``operations/services/runner/``) takes the profile's
live replicas by name, one step each, ``parallel`` at a time. A step places
the replacement beside the running replicas on free cards of the class (best
fit, ``best_fit_key``: a ready node holding none of the model's other live
replicas first, then the fewest free cards, then the name; the lowest-numbered
free cards), and stops the old replica once the new one is ready, freeing its
cards for the steps after it. Cards free before the restart come first: a step
is given cards an earlier step frees only when those alone do not fit, since
the run must then wait for that earlier step to end before it starts this one
(the plan counts in waves, the run in slots that free as each replacement is
ready). Where no node has room beside, and in place was allowed, the
old replica is stopped first and the replacement starts on its node: on its
own cards first, then free ones there. Steps running at the same time do not
see each other's freed cards.

``place_restart`` plays that through on plain data and says, per replica,
where it goes, or refuses naming the replica that has no place.

A replica across nodes (a profile with ``nodes > 1``) is a group of ranks, one a node, each on
``per_node`` cards of its node; ``pick_group`` chooses the nodes of one group (all of one fabric
domain), and the restart's run (``operations/services/placement.py`` ``group_best_fit``) picks by it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from base.errors import DomainError
from planning.units import cards


@dataclass(frozen=True)
class NodeCards:
    """One node's cards of the profile's class: all of them, and those held by no replica."""

    node: str
    ready: bool
    indices: tuple[int, ...]
    free: tuple[int, ...]
    # The node's fabric domain (``Node.fabric_domain``): a group spans nodes of one; "" joins none.
    fabric: str = ""


@dataclass(frozen=True)
class RankPlace:
    """One rank of a replica: the node it runs on and its card indices there. Rank 0 serves."""

    rank: int
    node: str
    cards: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "node": self.node, "cards": list(self.cards)}

    @property
    def text(self) -> str:
        return f"rank {self.rank} on {self.node} cards {', '.join(map(str, self.cards))}"


@dataclass(frozen=True)
class LiveReplica:
    """A live replica of the model: its node and card indices there.

    ``restarted`` is True for the replicas of the profile being changed (the
    restart's steps), False for the model's other replicas, which stay.
    ``cordoned``: those of its cards cordoned on their own: freed when it stops, but no
    replacement goes on them (in place or beside).
    """

    name: str
    node: str
    cards: tuple[int, ...]
    restarted: bool = True
    cordoned: tuple[int, ...] = ()
    # Every rank's place, rank 0's first (``node`` and ``cards`` are rank 0's); empty: one rank,
    # ``node`` and ``cards``. ``cordoned`` counts on rank 0's node only.
    ranks: tuple[RankPlace, ...] = ()

    @property
    def usable(self) -> list[int]:
        """Its cards a replacement may take once it stops: those not cordoned."""
        return [c for c in self.cards if c not in self.cordoned]

    @property
    def places(self) -> tuple[RankPlace, ...]:
        """Its ranks, one at least."""
        return self.ranks or (RankPlace(0, self.node, self.cards),)


@dataclass(frozen=True)
class Placement:
    """Where one replica's replacement goes: each of its ranks' node and cards (one rank on one
    node); ``node`` and ``cards`` are rank 0's."""

    replica: str
    node: str
    cards: tuple[int, ...]
    in_place: bool
    ranks: tuple[RankPlace, ...] = ()

    def __post_init__(self) -> None:
        if not self.ranks:
            object.__setattr__(self, "ranks", (RankPlace(0, self.node, tuple(self.cards)),))
        elif (self.ranks[0].rank, self.ranks[0].node, self.ranks[0].cards) != (
            0,
            self.node,
            tuple(self.cards),
        ):
            raise ValueError(f"{self.replica}: node and cards must be rank 0's")

    @classmethod
    def group(cls, replica: str, ranks: Sequence[RankPlace], *, in_place: bool) -> Placement:
        """A replica of ``ranks``, rank 0's first."""
        return cls(replica, ranks[0].node, ranks[0].cards, in_place, ranks=tuple(ranks))

    def as_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "in_place": self.in_place,
            "ranks": [r.as_dict() for r in self.ranks],
            "node": self.node,
            "cards": list(self.cards),
        }

    @property
    def text(self) -> str:
        how = "in place" if self.in_place else "beside"
        if len(self.ranks) == 1:
            return f"{self.replica} → {self.node} cards {', '.join(map(str, self.cards))} ({how})"
        return f"{self.replica} → {'; '.join(r.text for r in self.ranks)} ({how})"


def best_fit_key(on_sibling: bool, free_cards: int, node_name: str) -> tuple[bool, int, str]:
    """The order in which nodes with room take a replacement, smallest first: a node holding
    none of the model's other live replicas (so that one node going down does not take every
    replica of a model with it), then the fewest free cards that still fit (best fit, keeping
    larger holes for larger replicas), then the name. The restart's plan (``place_restart``)
    and its run (``operations/services/placement.py`` ``best_fit``) both pick by it."""
    return (on_sibling, free_cards, node_name)


def group_fit_key(chosen: Sequence[str], siblings: Collection[str], free: Mapping[str, int], domain: str):
    """The order in which fabric domains take a group, smallest first: the fewest of its nodes
    holding another of the model's live replicas, then the fewest free cards on them (best fit,
    as ``best_fit_key`` for one node), then the domain's name."""
    return (sum(n in siblings for n in chosen), sum(free[n] for n in chosen), domain)


def pick_group(
    free: Mapping[str, Sequence[int]],
    fabric: Mapping[str, str],
    per_node: int,
    nodes: int,
    *,
    siblings: Collection[str] = (),
) -> tuple[RankPlace, ...] | None:
    """The places of a group of ``nodes`` ranks of ``per_node`` cards each, on the nodes of
    ``free`` (each ready node's free card indices, of the profile's class): ``nodes`` nodes of one
    fabric domain (a node whose domain is blank joins no group), each with ``per_node`` free.
    Within a domain the nodes come by ``best_fit_key``, the domains by ``group_fit_key``; rank 0
    is the first node, and each rank takes its node's lowest-numbered free cards. None when no
    domain has ``nodes`` such nodes."""
    by_domain: dict[str, list[str]] = {}
    for node, cards_free in free.items():
        domain = fabric.get(node, "")
        if domain and len(cards_free) >= per_node:
            by_domain.setdefault(domain, []).append(node)
    counts = {node: len(cards_free) for node, cards_free in free.items()}
    best: tuple[Any, list[str]] | None = None
    for domain, names in sorted(by_domain.items()):
        if len(names) < nodes:
            continue
        chosen = sorted(names, key=lambda n: best_fit_key(n in siblings, counts[n], n))[:nodes]
        key = group_fit_key(chosen, siblings, counts, domain)
        if best is None or key < best[0]:
            best = (key, chosen)
    if best is None:
        return None
    return tuple(RankPlace(i, node, tuple(sorted(free[node])[:per_node])) for i, node in enumerate(best[1]))


def place_restart(
    nodes: Iterable[NodeCards],
    replicas: Sequence[LiveReplica],
    n: int,
    *,
    in_place: bool,
    parallel: int = 1,
    gpu_class: str = "",
    always_in_place: bool = False,
) -> tuple[Placement, ...]:
    """Each restarted replica's place, in restart order (by name), for
    replacements of ``n`` cards; ``in_place`` allows stopping a replica first
    where no node has room beside.

    ``always_in_place`` stops every replica first (a restart asked to be in
    place), room beside or not. Refuses (409) ``no_room_beside`` when a
    replica has no room beside and in place was not asked for, ``no_room`` when it has none either way; both
    name the replica and say what there is.
    """
    kind = f"{n} {gpu_class} {'card' if n == 1 else 'cards'}" if gpu_class else cards(n)
    ready = {c.node: c for c in nodes if c.ready}
    free = {name: sorted(c.free) for name, c in ready.items()}
    # The cards free before the restart and not yet given to a step: a replacement that fits on them
    # goes there, rather than on cards an earlier step's old replica frees, which the run would
    # have to wait for (that step's end) before it could start the replacement.
    idle = {name: set(c.free) for name, c in ready.items()}
    live = {r.name: r for r in replicas}
    steps = sorted((r for r in replicas if r.restarted), key=lambda r: r.name)
    placements: list[Placement] = []
    wave_frees: list[LiveReplica] = []
    for i, old in enumerate(steps):
        if i % max(parallel, 1) == 0:
            # A new wave: the earlier steps' old replicas have stopped by now.
            for done in wave_frees:
                live.pop(f"{done.name} (old)", None)
                for place in done.places:  # a group's every rank frees its cards
                    if place.node in free:
                        usable = done.usable if place.rank == 0 else place.cards
                        free[place.node] = sorted({*free[place.node], *usable})
            wave_frees = []
        siblings = {p.node for name, r in live.items() if name != old.name for p in r.places}
        fits = [] if always_in_place else [name for name, cards_free in free.items() if len(cards_free) >= n]
        if fits:
            without_waiting = [name for name in fits if len(idle[name]) >= n]
            if without_waiting:
                node = min(
                    without_waiting, key=lambda name: best_fit_key(name in siblings, len(idle[name]), name)
                )
                chosen = tuple(sorted(idle[node])[:n])
            else:
                node = min(fits, key=lambda name: best_fit_key(name in siblings, len(free[name]), name))
                chosen = tuple(free[node][:n])
            free[node] = [c for c in free[node] if c not in chosen]
            idle[node] -= set(chosen)
            placements.append(Placement(old.name, node, chosen, in_place=False))
            live[old.name] = LiveReplica(old.name, node, chosen)  # the replacement, until old stops
            live[f"{old.name} (old)"] = old
            wave_frees.append(old)
            continue
        most_free = max((len(c) for c in free.values()), default=0)
        if not in_place and not always_in_place:
            raise DomainError(
                "no_room_beside",
                f"{old.name} has no place: no ready node has {kind} free beside the running replicas "
                f"({most_free} at most are free when its turn comes). Restarting in place stops each replica "
                f"without room beside before its replacement starts on the cards it frees; the model does not "
                f"answer while the new one loads.",
                status=409,
            )
        home = ready.get(old.node)
        own = old.usable
        there = sorted({*own, *free.get(old.node, [])}) if home else []
        if len(there) < n and home is not None and old.cordoned:
            raise DomainError(
                "no_room", _cordoned_in_the_way(old, n, kind, len(there), most_free), status=409
            )
        if len(there) < n:
            what = (
                f"{old.node} is not ready"
                if home is None
                else f"{old.node} has only {len(there)} with {old.name}'s own freed"
            )
            raise DomainError(
                "no_room",
                f"{old.name} has no place: in place needs {kind} on its node, and {what}; no ready node has "
                f"{kind} free beside either ({most_free} at most are free then): other models hold them. Free "
                f"{kind} on one ready node (move or stop another model's replica there), or uncordon a node of "
                "the class.",
                status=409,
            )
        chosen = tuple((own + [c for c in free[old.node] if c not in own])[:n])
        chosen = tuple(sorted(chosen))
        leftover = [c for c in there if c not in chosen]
        free[old.node] = leftover
        idle[old.node] -= set(chosen)
        placements.append(Placement(old.name, old.node, chosen, in_place=True))
        live[old.name] = LiveReplica(old.name, old.node, chosen)
    return tuple(placements)


def _cordoned_in_the_way(old: LiveReplica, n: int, kind: str, there: int, most_free: int) -> str:
    """The refusal of an in-place step that only the replica's own cordoned cards keep from fitting:
    which cards, and what to do."""
    cordoned = ", ".join(str(c) for c in old.cordoned)
    one = len(old.cordoned) == 1
    return (
        f"{old.name} has no place: in place needs {kind} on {old.node}, and only {there} would be usable "
        f"there once it stops, because its card{'' if one else 's'} {cordoned} of {old.node} "
        f"{'is' if one else 'are'} cordoned and no replacement goes on a cordoned card; no ready node has "
        f"{kind} free beside either ({most_free} at most are free then). Uncordon card"
        f"{'' if one else 's'} {cordoned} of {old.node} if {'it is' if one else 'they are'} sound, or free "
        f"{kind} on another node of its class so that its replacement starts there."
    )
