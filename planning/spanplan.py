"""The checks of a planned change whose replicas span nodes (``groups``): memory per rank and room
for every rank of every replica. ``plan.plan_resize`` and ``plan.plan_context`` call them for a
profile of ``nodes > 1`` on an engine that spans nodes; the one-node checks stay in ``plan``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from base.errors import DomainError
from base.notes import Notes
from planning.checks import CONTEXT_CHANGE, Fleet, finish, floor_refusals, unknown_note, with_change
from planning.engines import Engine
from planning.groups import Span, first_group, group_refusal, place_group_restart
from planning.memory import card_memory, longest_context_that_fits
from planning.placement import NodeCards
from planning.rules import MAX_CARDS, splits_heads
from planning.stages import Stage, fullest, longest_pipeline_context, pipeline_memory
from planning.types import Change, ModelSpec, NodeRoom, ProfileSpec, Room
from planning.units import gib, gib_short


def _terms(memory: Any) -> str:
    return ", ".join(f"{t.name.replace('_', ' ')} {gib(t.bytes)}" for t in memory.terms if t.inside)


def _more_nodes(
    eng: Engine,
    model: ModelSpec,
    span: Span,
    context: int,
    budget: int | None,
    args: Any,
    card: dict[str, Any],
) -> int | None:
    """The fewest nodes above ``span.nodes`` (of ``span.per_node`` cards each) on which every rank fits."""
    shape = model.shape
    assert shape is not None
    for nodes in range(span.nodes + 1, MAX_CARDS // span.per_node + 1):
        if eng.span == "pipeline":
            stages = pipeline_memory(eng, shape, span.per_node, nodes, context, budget, args=args, **card)
            if stages is not None and all(s.memory.fits for s in stages):
                return nodes
        elif splits_heads(shape.kv_heads, shape.attention_heads, span.per_node * nodes):
            memory = card_memory(eng, shape, span.per_node * nodes, context, budget, args=args, **card)
            if memory is not None and memory.fits:
                return nodes
    return None


def check_group_memory(
    *,
    model: ModelSpec,
    eng: Engine,
    p: ProfileSpec,
    span: Span,
    context: int | None,
    budget: int | None,
    change: Change,
    notes: Notes,
    card: dict[str, Any],
) -> Change:
    """What each rank's cards hold: a pipeline engine's every stage (the fullest is the answer's
    ``memory``), a tensor engine's 1/TP of everything over all the cards. Refuses (400) ``memory``
    naming the rank that does not fit, with the nodes and the context that would."""
    note = unknown_note(model, context, heads_checked=None)
    if note:
        notes.add(note)
    shape = model.shape
    if eng.span == "pipeline":
        if shape is not None and not shape.layers and not note:
            notes.add(
                f"{model.name}'s layers are not known, so what each pipeline stage holds is not checked."
            )
        stages = pipeline_memory(eng, shape, span.per_node, span.nodes, context, budget, args=p.args, **card)
        if stages is None:
            return change
        worst = fullest(stages)
        memory = worst.memory
        per_card = (
            f"{memory.per_card}: rank {worst.index}, the fullest of {span.nodes} pipeline stages "
            f"({worst.holds})"
        )
        change = replace(change, memory=memory, per_card=per_card, stages=stages)
        failing: Stage | None = next((s for s in stages if not s.memory.fits), None)
    else:
        memory_all = card_memory(eng, shape, span.cards, context, budget, args=p.args, **card)
        if memory_all is None:
            return change
        change = replace(
            change, memory=memory_all, per_card=f"{memory_all.per_card}, over {span.nodes} nodes"
        )
        failing = None
        memory = memory_all
    if memory.fits and failing is None:
        return change
    assert shape is not None and context is not None  # fits otherwise
    if failing is not None:
        memory = failing.memory
        who = f"Rank {failing.index} (pipeline stage {failing.index}: {failing.holds})"
    else:
        who = f"Every rank (tensor parallel {span.cards} wide over {span.nodes} nodes)"
    terms = _terms(memory)
    held = (
        f"{who} would hold {gib(memory.need)} GiB on each of its {p.gpu_class} cards (weights "
        f"{gib(memory.weights)}, KV cache {gib(memory.kv)} for {memory.context} tokens"
        f"{', ' + terms if terms else ''}), more than the {gib_short(memory.budget or 0)} GiB usable on each "
        f"({memory.budget_how})."
    )
    more = _more_nodes(eng, model, span, context, budget, p.args, card)
    more_said = (
        f"more nodes ({more} of {span.per_node} cards, {more * span.per_node} cards in all, would hold it)"
        if more
        else "more nodes"
    )
    if eng.span == "pipeline":
        shorter = longest_pipeline_context(
            eng, shape, span.per_node, span.nodes, budget, memory.context, args=p.args, **card
        )
    else:
        shorter = longest_context_that_fits(
            eng, shape, span.cards, budget, memory.context, args=p.args, **card
        )
    context_change = CONTEXT_CHANGE.format(name=model.name)
    less = (
        f"a shorter context (at most {shorter} tokens fits on {span.nodes} nodes) through {context_change}"
        if shorter
        else f"a shorter context through {context_change}, though even one token does not fit on {span.nodes} nodes"
    )
    raise DomainError(
        "memory", f"{held} Two ways out: {more_said}, or {less}.", change=finish(change, notes).as_dict()
    )


def _cards_of_rooms(rooms: Iterable[NodeRoom], gpu_class: str) -> tuple[NodeCards, ...]:
    """The class's cards on each node as the room counts give them (a fleet not read): the free
    ones taken as the lowest-numbered."""
    return tuple(
        NodeCards(r.node, r.ready, tuple(range(r.cards)), tuple(range(r.free)), fabric=r.fabric)
        for r in rooms
        if r.gpu_class == gpu_class
    )


def check_group_room(
    rooms: Iterable[NodeRoom],
    eng: Engine,
    p: ProfileSpec,
    span: Span,
    *,
    in_place: bool,
    change: Change,
    notes: Notes,
    fleet: Fleet | None,
) -> Change:
    """Where every rank of every new replica goes: each restarted replica's group in restart order
    (``groups.place_group_restart``), or, with none to restart, the group a first replica would take.
    Refuses (409) ``too_few_cards`` when no fabric domain has enough nodes of the class at all, else
    ``no_room`` / ``no_room_beside``, each naming the rank with no place and why."""
    assert p.gpu_class is not None
    rooms = list(rooms)
    mine = [r for r in rooms if r.gpu_class == p.gpu_class]
    errors = floor_refusals(eng, p, fleet, (r.node for r in mine if r.ready), notes)
    if not p.engine_version:
        notes.add(
            f"The profile names no {eng.name} release (nor does the fleet's default), so its ranks' nodes are "
            "not held to one release: set one to have every rank run it."
        )
    refused: Mapping[str, str] = {node: err.message for node, err in errors.items()}
    if not any(r.ready for r in mine):
        raise with_change(
            DomainError(
                "no_class",
                f"No ready node has {p.gpu_class} cards. Uncordon a node of that class (or wait until its agent "
                "answers), add one, or give the profile another GPU class.",
                status=409,
            ),
            change,
            notes,
        )
    cards = fleet.cards if fleet is not None else _cards_of_rooms(rooms, p.gpu_class)
    fabric = {r.node: r.fabric for r in mine}
    cards = tuple(replace(c, fabric=c.fabric or fabric.get(c.node, "")) for c in cards)
    whole = [replace(c, free=c.indices) for c in cards]
    try:
        if first_group(whole, span, refused=refused) is None:
            most = max((r.cards for r in mine if r.ready), default=0)
            err = group_refusal(
                "too_few_cards",
                rooms,
                p.gpu_class,
                span,
                free=None,
                refused=refused,
                fix=f"Put {span.nodes} ready nodes of the class that share a fabric in one fabric domain (the "
                f"node's editor), add nodes, or ask for {most} cards or fewer.",
            )
            head = f"No node has {span.cards} {p.gpu_class} cards; the most one has is {most}. Across nodes, "
            raise DomainError(err.code, head + err.message, status=err.status)
        if fleet is not None and any(r.restarted for r in fleet.replicas):
            places = place_group_restart(
                cards,
                fleet.replicas,
                span,
                in_place=in_place,
                rooms=rooms,
                gpu_class=p.gpu_class,
                parallel=fleet.parallel,
                refused=refused,
            )
            room = Room(in_place=any(pl.in_place for pl in places), places=places)
        else:
            ranks = first_group(cards, span, refused=refused)
            if ranks is None:
                raise group_refusal(
                    "no_room",
                    rooms,
                    p.gpu_class,
                    span,
                    free={c.node: len(c.free) for c in cards},
                    refused=refused,
                    fix="Free whole nodes of one fabric domain (move or stop other models' replicas there; the "
                    "nodes page shows who holds each card), or ask for fewer cards.",
                )
            room = Room(in_place=False, beside=tuple(r.node for r in ranks))
    except DomainError as err:
        raise with_change(err, change, notes) from None
    return replace(change, room=room, in_place=room.in_place)
