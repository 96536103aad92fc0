"""A replica across nodes, planned: how many nodes, how the profile spreads over them, and where
every rank of every replica goes.

A resize to more cards than one node of the class has spans the fewest nodes that divide the cards
evenly (``nodes_for``), or the nodes the request names; the engine's span mode (engines.toml
``span``) lays the profile out (``respread_group``), or the engine cannot span and the resize is
refused with its reason. Every rank needs a whole node's share of free cards of the profile's class
on a ready node that runs the profile's release, and the nodes of one replica must share a fabric
domain (``Node.fabric_domain``; blank joins none). ``place_group_restart`` plays the restart
through as ``placement.place_restart`` does for one node; ``group_refusal`` says, when there is no
place, which rank has none and why for each node that could not take it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from base.errors import DomainError
from planning.engines import Engine, drop_spellings, group_widths, span_refusal
from planning.placement import LiveReplica, NodeCards, Placement, RankPlace, pick_group
from planning.rules import card_counts_that_split, splits_heads
from planning.types import ROOM_NODES_NAMED, NodeRoom, ProfileSpec, Shape
from planning.units import and_list, cards, or_list


@dataclass(frozen=True)
class Span:
    """A replica of ``per_node`` cards on each of ``nodes`` nodes."""

    nodes: int
    per_node: int

    @property
    def cards(self) -> int:
        return self.nodes * self.per_node


def most_cards(rooms: Iterable[NodeRoom], gpu_class: str | None) -> int:
    """The most cards of the class one ready node has (0: none)."""
    return max((r.cards for r in rooms if r.ready and r.gpu_class == gpu_class), default=0)


def nodes_for(gpus: int, most: int, asked: int | None) -> Span | None:
    """The span of a replica of ``gpus`` cards: the ``asked`` nodes, else one node when one holds
    them (``most``: the most cards a ready node of the class has; 0 when none is known, so one node
    and the room check says why), else the fewest nodes that divide ``gpus`` evenly with no more than
    ``most`` a node. None when no count of nodes does (a prime count above a node, say).
    Refuses (400) ``nodes_range`` for an ``asked`` that does not divide ``gpus``."""
    if asked is not None:
        if asked < 1 or gpus % asked:
            raise DomainError(
                "nodes_range",
                f"{cards(gpus)} do not split evenly over {asked} node{'' if asked == 1 else 's'}: a replica "
                f"across nodes runs the same number of cards on each. Ask for a number of nodes that divides "
                f"{gpus} ({or_list([n for n in range(1, gpus + 1) if gpus % n == 0])}).",
            )
        return Span(asked, gpus // asked)
    if most == 0 or gpus <= most:
        return Span(1, gpus)
    for n in range(2, gpus + 1):
        if gpus % n == 0 and gpus // n <= most:
            return Span(n, gpus // n)
    return None


def refuse_span(eng: Engine, gpus: int, gpu_class: str | None, most: int, span: Span | None) -> None:
    """``too_few_cards`` (409) when ``gpus`` cards need more than one node and the engine cannot
    span nodes, or no even split fits a node; nothing otherwise."""
    if span is not None and span.nodes == 1:
        return
    head = (
        f"No node has {gpus} {gpu_class} cards; the most one has is {most}."
        if span is None or span.per_node > most or most == 0
        else f"{gpus} {gpu_class} cards are more than one node has (the most is {most})."
    )
    reason = span_refusal(eng)
    if reason is not None:
        raise DomainError(
            "too_few_cards",
            f"{head} A replica of the {eng.name} engine cannot run across nodes: {reason}. Ask for {most} or "
            f"fewer, add a node with {gpus}, or give the profile an engine that spans nodes (vLLM, SGLang).",
            status=409,
        )
    if span is None:
        raise DomainError(
            "too_few_cards",
            f"{head} Across nodes a replica runs the same number of cards on each, and no count of nodes "
            f"divides {gpus} into {most} or fewer a node. Ask for a multiple of a node's share (e.g. "
            f"{most * 2}), or name the nodes (nodes).",
            status=409,
        )
    if span.per_node > most:
        raise DomainError(
            "too_few_cards",
            f"{head} Over {span.nodes} nodes a replica needs {span.per_node} cards on each. Ask for more nodes "
            f"or fewer cards.",
            status=409,
        )


def respread_group(profile: ProfileSpec, span: Span, shape: Shape | None, eng: Engine) -> ProfileSpec:
    """``profile`` across ``span.nodes`` nodes of ``span.per_node`` cards, as the engine spans them:
    TP the width within a node (``tp = gpus_per_node = per_node``), ``nodes`` the ranks, ``pp`` the
    pipeline stages of a "pipeline" engine (0 for a "tensor" one, whose TP runs over every card:
    ``engines.group_widths``). Refuses (400) ``heads`` when the engine's TP does not split the heads,
    ``layers`` when there are fewer layers than stages."""
    tp, pp = group_widths(eng, span.per_node, span.nodes)
    kv = shape.kv_heads if shape else None
    attention = shape.attention_heads if shape else None
    if not splits_heads(kv, attention, tp):
        would = [n for n in card_counts_that_split(kv, attention, up_to=tp * 2) if n % span.per_node == 0]
        raise DomainError(
            "heads",
            f"Across {span.nodes} nodes the {eng.name} engine runs tensor parallel {tp} wide, which cannot "
            f"spread the model's {kv} KV heads and {attention} attention heads: it needs a width that divides "
            f"the attention heads and divides, or is a multiple of, the KV heads"
            + (f" ({or_list(would)})." if would else "."),
        )
    layers = shape.layers if shape else None
    if pp > 1 and layers and layers < pp:
        raise DomainError(
            "layers",
            f"Across {span.nodes} nodes the {eng.name} engine runs {pp} pipeline stages, a node each, and the "
            f"model has {layers} layers: each stage needs one at least. Ask for {layers} nodes or fewer.",
        )
    args = tuple(drop_spellings(eng, profile.args, eng.tp_flags))
    env = tuple((k, v) for k, v in profile.env if k not in eng.tp_env)
    return replace(
        profile,
        args=args,
        env=env,
        tp=span.per_node,
        gpus_per_node=span.per_node,
        nodes=span.nodes,
        pp=pp if pp > 1 else 0,
    )


def span_of(profile: ProfileSpec) -> Span:
    """The span a profile describes: ``nodes`` ranks of ``cards // nodes`` cards each."""
    nodes = max(profile.nodes, 1)
    return Span(nodes, profile.cards // nodes)


# -- room ------------------------------------------------------------------------


def _said(names: Sequence[str]) -> str:
    shown = list(names[:ROOM_NODES_NAMED])
    more = len(names) - len(shown)
    return and_list(shown + ([f"{more} more"] if more else []))


def group_refusal(
    code: str,
    rooms: Iterable[NodeRoom],
    gpu_class: str,
    span: Span,
    *,
    free: Mapping[str, int] | None,
    refused: Mapping[str, str],
    replica: str | None = None,
    fix: str = "",
) -> DomainError:
    """The refusal (409) of a group with no place: which rank has none, and why each node that could
    not take it could not (class, fabric, cards, release, not ready). ``free`` is each node's free
    cards of the class (None: the static check, by the cards nodes have)."""
    rooms = list(rooms)
    fabric = {r.node: r.fabric for r in rooms}
    classes: dict[str, set[str]] = {}
    for r in rooms:
        classes.setdefault(r.node, set()).add(r.gpu_class)
    mine = {r.node: r for r in rooms if r.gpu_class == gpu_class}
    room = {name: (r.cards if free is None else free.get(name, 0)) for name, r in mine.items()}

    def takes(name: str) -> bool:
        r = mine.get(name)
        return r is not None and r.ready and name not in refused and room[name] >= span.per_node

    domains: dict[str, list[str]] = {}
    for name in sorted(mine):
        if fabric.get(name) and takes(name):
            domains.setdefault(fabric[name], []).append(name)
    best = max(sorted(domains), key=lambda d: len(domains[d]), default=None)
    placed = len(domains[best]) if best is not None else 0
    why: list[str] = []
    for name in sorted(fabric):
        if best is not None and fabric[name] == best and takes(name):
            continue
        if name not in mine:
            if best is None or fabric[name] == best:
                why.append(f"{name} has {and_list(sorted(classes[name]))} cards, not {gpu_class} (class)")
            continue
        r = mine[name]
        if not r.ready:
            why.append(f"{name} is not ready (cordoned, down, or its agent does not answer)")
        elif name in refused:
            why.append(f"{refused[name]} (release)")
        elif room[name] < span.per_node:
            have = f"only {room[name]} {gpu_class} card{'' if room[name] == 1 else 's'}"
            why.append(f"{name} has {have}{' free' if free is not None else ''} (cards)")
        elif not fabric[name]:
            why.append(f"{name} has no fabric domain, so it joins no group (fabric)")
        else:
            why.append(f"{name} is in fabric domain {fabric[name]}, not {best} (fabric)")
    where = (
        f"fabric domain {best} has {placed} such node{'' if placed == 1 else 's'}"
        if best is not None
        else "no fabric domain has one"
    )
    whose = f"{replica}: " if replica else ""
    what = "free " if free is not None else ""
    message = (
        f"{whose}rank {placed} of {span.nodes} has no place. A replica of {span.cards} {gpu_class} cards runs "
        f"as {span.nodes} ranks, one a ready node with {span.per_node} {what}{gpu_class} "
        f"card{'' if span.per_node == 1 else 's'}, all of one "
        f"fabric domain and able to run the profile's release; {where}."
    )
    if why:
        shown = why[: ROOM_NODES_NAMED * 2]
        more = len(why) - len(shown)
        message += " Not the others: " + "; ".join(shown) + (f"; and {more} more" if more else "") + "."
    return DomainError(code, message + (" " + fix if fix else ""), status=409)


def _free_map(free: Mapping[str, Sequence[int]]) -> dict[str, int]:
    return {name: len(cards_free) for name, cards_free in free.items()}


def place_group_restart(
    nodes: Iterable[NodeCards],
    replicas: Sequence[LiveReplica],
    span: Span,
    *,
    in_place: bool,
    rooms: Iterable[NodeRoom],
    gpu_class: str,
    parallel: int = 1,
    refused: Mapping[str, str] | None = None,
) -> tuple[Placement, ...]:
    """Each restarted replica's group in restart order (by name), as ``placement.place_restart`` plays
    one node's: beside on free cards (those free before the restart first), else, with ``in_place``,
    once every rank of the old replica has stopped, on the cards that frees and those free. Refuses
    (409) ``no_room_beside`` / ``no_room`` naming the replica and the rank with no place."""
    refused = refused or {}
    rooms = list(rooms)
    ready = {c.node: c for c in nodes if c.ready and c.node not in refused}
    fabric = {c.node: c.fabric for c in ready.values()}
    free = {name: sorted(c.free) for name, c in ready.items()}
    idle = {name: set(c.free) for name, c in ready.items()}
    live = {r.name: r for r in replicas}
    steps = sorted((r for r in replicas if r.restarted), key=lambda r: r.name)
    placements: list[Placement] = []
    wave_frees: list[LiveReplica] = []

    def release(old: LiveReplica) -> None:
        for place in old.places:
            if place.node in free:
                usable = old.usable if place.rank == 0 else place.cards
                free[place.node] = sorted({*free[place.node], *usable})

    for i, old in enumerate(steps):
        if i % max(parallel, 1) == 0:
            for done in wave_frees:
                live.pop(f"{done.name} (old)", None)
                release(done)
            wave_frees = []
        siblings = {p.node for name, r in live.items() if name != old.name for p in r.places}
        ranks = pick_group(
            {n: sorted(c) for n, c in idle.items()}, fabric, span.per_node, span.nodes, siblings=siblings
        )
        ranks = ranks or pick_group(free, fabric, span.per_node, span.nodes, siblings=siblings)
        how_in_place = False
        if ranks is None:
            if not in_place:
                raise group_refusal(
                    "no_room_beside",
                    rooms,
                    gpu_class,
                    span,
                    free=_free_map(free),
                    refused=refused,
                    replica=old.name,
                    fix="Restarting in place stops every rank of each replica without room beside before its "
                    "replacement starts on the cards they free; the model does not answer while the new one loads.",
                )
            release(old)
            live.pop(old.name, None)
            ranks = pick_group(free, fabric, span.per_node, span.nodes, siblings=siblings)
            how_in_place = True
            if ranks is None:
                raise group_refusal(
                    "no_room",
                    rooms,
                    gpu_class,
                    span,
                    free=_free_map(free),
                    refused=refused,
                    replica=old.name,
                    fix="Free whole nodes of one fabric domain (move or stop other models' replicas there; the "
                    "nodes page shows who holds each card), give more nodes of the class a fabric domain, or ask "
                    "for fewer cards.",
                )
        for place in ranks:
            free[place.node] = [c for c in free[place.node] if c not in place.cards]
            idle[place.node] -= set(place.cards)
        placements.append(Placement.group(old.name, ranks, in_place=how_in_place))
        live[old.name] = LiveReplica(old.name, ranks[0].node, ranks[0].cards, ranks=ranks)
        if not how_in_place:
            live[f"{old.name} (old)"] = old
            wave_frees.append(old)
    return tuple(placements)


def first_group(
    nodes: Iterable[NodeCards], span: Span, *, refused: Mapping[str, str] | None = None
) -> tuple[RankPlace, ...] | None:
    """Where a first replica of ``span`` would go on the free cards (none running to restart)."""
    refused = refused or {}
    ready = [c for c in nodes if c.ready and c.node not in refused]
    return pick_group(
        {c.node: c.free for c in ready}, {c.node: c.fabric for c in ready}, span.per_node, span.nodes
    )
