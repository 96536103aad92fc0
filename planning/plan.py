"""The two planned changes: a model to N cards, and a model to T tokens of
context. Each runs every check in docs/design.md's order ("Resize") and answers with the
``Change``, or refuses with a ``DomainError`` carrying the part of the change
worked out so far.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from base.errors import DomainError, declared
from base.notes import Notes
from planning.checks import CONTEXT_CHANGE, Fleet, card_of, finish, floor_refusals, unknown_note, with_change
from planning.engines import (
    Engine,
    drop_spellings,
    engine,
    group_widths,
    launch_args,
    parse_capability,
    refusals,
    span_refusal,
    terms_for,
    with_context,
)
from planning.groups import Span, most_cards, nodes_for, respread_group, span_of
from planning.memory import card_memory, longest_context_that_fits
from planning.placement import place_restart
from planning.releases import floor_of, parse_version
from planning.room import room_for
from planning.rules import MAX_CARDS, context_of, heads_known, pick_profile, respread, splits_heads
from planning.spanplan import check_group_memory, check_group_room
from planning.types import CardMemory, Change, GPUClassSpec, ModelSpec, NodeRoom, ProfileSpec, Shape
from planning.units import cards, gib, gib_short

# When the model does not say how long its context may be, a ceiling still
# keeps a typo (an extra zero or ten) out of a profile: 16 Mi tokens is past
# any model served today.
MAX_UNKNOWN_CONTEXT = 2**24


def _is_count(value: object) -> bool:
    # bool is an int subclass; True is not a card count.
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse_declared(model: ModelSpec) -> None:
    if model.declared:
        raise declared(model.name, model.declared_in or "the cluster's settings file")


def _launch(eng: Engine, model: ModelSpec, p: ProfileSpec) -> tuple[str, ...]:
    """The engine's arguments for ``p``, as the node agent will start it (after
    the program its own configuration names for the engine)."""
    # The port is each replica's own, chosen when the restart places it.
    port: Any = "{port}"
    # Across nodes the engine's own TP width (SGLang's counts every node's cards); the rank flags are
    # each rank's, written by the launcher.
    tp = group_widths(eng, p.tp, p.nodes)[0] if p.nodes > 1 else p.tp
    return tuple(launch_args(eng, source=model.source, port=port, model=model.name, tp=tp, args=p.args))


def _refuse_forbidden(
    eng: Engine, p: ProfileSpec, change: Change, notes: Notes, *, context_max: int | None
) -> None:
    """The new profile must pass the registry's refusals, as its save will: a
    dry run never approves what the real change then refuses (the registry may
    have learnt a refusal since the profile was saved)."""
    sentences = [r.sentence for r in refusals(eng, p.args, p.env, context_max=context_max)]
    if sentences:
        raise DomainError(
            "refused_arg",
            " ".join(sentences) + " Remove it from the profile first.",
            change=finish(change, notes).as_dict(),
        )


def _engine_of(p: ProfileSpec, change: Change, notes: Notes) -> Engine:
    try:
        return terms_for(engine(p.engine), p.engine_version)
    except DomainError as err:
        raise with_change(err, change, notes) from None


def _check_class(
    eng: Engine, p: ProfileSpec, spec: GPUClassSpec | None, change: Change, notes: Notes
) -> int | None:
    """The class's usable bytes a card (None: unknown), after refusing a class
    older than the engine needs (400 ``capability``)."""
    if spec is None:
        notes.add(
            f"The {p.gpu_class} class is not in the catalog, so its usable memory and compute capability "
            "are not checked."
        )
        return None
    have, need = parse_capability(spec.capability), parse_capability(eng.min_capability)
    if have is None:
        notes.add(f"The compute capability of {spec.name} cards is not known, so it is not checked.")
    elif need is not None and have < need:
        raise DomainError(
            "capability",
            f"The {eng.name} engine needs cards of compute capability {eng.min_capability} or newer; "
            f"{spec.name} cards are {spec.capability}.",
            change=finish(change, notes).as_dict(),
        )
    floor = floor_of(eng.floors, p.engine_version)
    floor_need = parse_version(floor.capability) if floor is not None and floor.capability else None
    have_release = parse_version(spec.capability)
    if (
        floor is not None
        and floor_need is not None
        and have_release is not None
        and have_release < floor_need
    ):
        release = f"{eng.name} {p.engine_version}" if p.engine_version else f"The {eng.name} engine"
        raise DomainError(
            "capability",
            f"{release} needs cards of compute capability {floor.capability} or newer; {spec.name} cards are "
            f"{spec.capability}.",
            change=finish(change, notes).as_dict(),
        )
    return spec.usable_bytes if spec.usable_bytes > 0 else None


def _memory_refusal(
    *,
    model: ModelSpec,
    eng: Engine,
    p: ProfileSpec,
    shape: Shape,
    memory: CardMemory,
    budget: int | None,
    next_cards: int | None,
    card: dict[str, Any],
) -> str:
    n = memory.cards
    terms = ", ".join(f"{t.name.replace('_', ' ')} {gib(t.bytes)}" for t in memory.terms if t.inside)
    held = (
        f"On {n} {p.gpu_class} {'card' if n == 1 else 'cards'} each would hold {gib(memory.need)} GiB "
        f"(weights {gib(memory.weights)}, KV cache {gib(memory.kv)} for {memory.context} tokens"
        f"{', ' + terms if terms else ''}), more than the {gib_short(memory.budget or 0)} GiB "
        f"usable on each ({memory.budget_how})."
    )
    more = f"more cards ({cards(next_cards)} would hold it)" if next_cards else "more cards"
    shorter = longest_context_that_fits(eng, shape, n, budget, memory.context, args=p.args, **card)
    context = CONTEXT_CHANGE.format(name=model.name)
    if shorter:
        less = f"a shorter context (at most {shorter} tokens fits on {cards(n)}) through {context}"
    else:
        less = f"a shorter context through {context}, though even one token does not fit on {cards(n)}"
    return f"{held} Two ways out: {more}, or {less}."


def _fewest_cards_that_fit(
    eng: Engine, shape: Shape, context: int, budget: int | None, above: int, args, card: dict[str, Any]
) -> int | None:
    """The fewest cards above ``above`` that the engine can spread over and
    whose share fits ``budget``, or None."""
    if eng.spread == "single":
        return None
    for n in range(above + 1, MAX_CARDS + 1):
        if eng.spread == "tensor" and not splits_heads(shape.kv_heads, shape.attention_heads, n):
            continue
        memory = card_memory(eng, shape, n, context, budget, args=args, **card)
        if memory is not None and memory.fits:
            return n
    return None


def _check_memory(
    *,
    model: ModelSpec,
    eng: Engine,
    p: ProfileSpec,
    n: int,
    context: int | None,
    budget: int | None,
    change: Change,
    notes: Notes,
    heads_checked: bool | None,
    card: dict[str, Any],
) -> Change:
    note = unknown_note(model, context, heads_checked=heads_checked)
    if note:
        notes.add(note)
    memory = card_memory(eng, model.shape, n, context, budget, args=p.args, **card)
    if memory is None:
        return change
    change = replace(change, memory=memory, per_card=memory.per_card)
    if not memory.fits:
        assert model.shape is not None and context is not None  # fits is True otherwise
        raise DomainError(
            "memory",
            _memory_refusal(
                model=model,
                eng=eng,
                p=p,
                shape=model.shape,
                memory=memory,
                budget=budget,
                next_cards=_fewest_cards_that_fit(eng, model.shape, context, budget, n, p.args, card),
                card=card,
            ),
            change=finish(change, notes).as_dict(),
        )
    return change


def _check_room(
    nodes: Iterable[NodeRoom],
    p: ProfileSpec,
    n: int,
    *,
    running: int,
    in_place: bool,
    change: Change,
    notes: Notes,
    fleet: Fleet | None,
) -> Change:
    """Where the new replicas go. With ``fleet`` (the class's cards and the
    model's live replicas), the whole restart is played through and every
    replica must have a place; without, whether some node has room."""
    assert p.gpu_class is not None  # pick_profile never answers a CPU-only profile
    simulate = fleet is not None and any(r.restarted for r in fleet.replicas)
    nodes = list(nodes)
    # Only the nodes that could take a replica are checked and named: a node that is down takes none.
    refused = floor_refusals(
        engine(p.engine), p, fleet, (r.node for r in nodes if r.gpu_class == p.gpu_class and r.ready), notes
    )
    if refused:
        # A node that fails the release's floors, or lacks the release, takes none of its replicas.
        nodes = [replace(r, ready=False) if r.node in refused else r for r in nodes]
        assert fleet is not None
        fleet = replace(
            fleet, cards=tuple(replace(c, ready=False) if c.node in refused else c for c in fleet.cards)
        )
    try:
        room = room_for(nodes, p.gpu_class, n, running=running > 0 and not simulate, in_place=in_place)
        if simulate:
            assert fleet is not None
            places = place_restart(
                fleet.cards,
                fleet.replicas,
                n,
                in_place=in_place,
                parallel=fleet.parallel,
                gpu_class=p.gpu_class,
            )
            room = replace(room, places=places, in_place=any(pl.in_place for pl in places))
    except DomainError as err:
        answer = err
        if err.code == "too_few_cards":
            answer = DomainError(
                err.code, err.message + _why_one_node(engine(p.engine), n, nodes, p), status=err.status
            )
        if refused:
            # Nowhere to go because of the nodes the release cannot run on: that is the answer.
            first = refused[min(refused)]
            others = f" ({len(refused) - 1} other node(s) refused too)" if len(refused) > 1 else ""
            answer = DomainError(first.code, first.message + others, status=first.status)
        raise with_change(answer, change, notes) from None
    return replace(change, room=room, in_place=room.in_place)


def _why_one_node(eng: Engine, n: int, nodes: Iterable[NodeRoom], p: ProfileSpec) -> str:
    """Why a replica of ``n`` cards more than a node has was not planned across nodes."""
    reason = span_refusal(eng)
    if reason is not None:
        return f" A replica of the {eng.name} engine cannot run across nodes: {reason}."
    most = most_cards(nodes, p.gpu_class)
    across = nodes_for(n, most, None)
    if across is not None and across.nodes > 1:
        # It could span them: one node was asked for.
        return f" One node was asked for: leave nodes out (or name {across.nodes}) to run it across nodes."
    return (
        f" Across nodes a replica runs the same number of cards on each, and no count of nodes divides {n} "
        f"into {most} or fewer a node: ask for a multiple of a node's share."
    )


def _span(
    eng: Engine,
    p: ProfileSpec,
    gpus: int,
    nodes: list[NodeRoom],
    asked: int | None,
    change: Change,
    notes: Notes,
) -> Span | None:
    """The nodes a replica of ``gpus`` cards spans (``groups.nodes_for``); None for one node, and for
    an engine that cannot span nodes (the room check then refuses with its reason). Refuses (400)
    ``nodes_range`` for nodes that do not divide the cards and ``single_node_engine`` for nodes
    asked of an engine that cannot span them."""
    try:
        span = nodes_for(gpus, most_cards(nodes, p.gpu_class), asked)
        reason = span_refusal(eng)
        if asked is not None and asked > 1 and reason is not None:
            raise DomainError(
                "single_node_engine",
                f"A replica of the {eng.name} engine cannot run across nodes: {reason}. Ask for one node.",
            )
    except DomainError as err:
        raise with_change(err, change, notes) from None
    if span is None or span.nodes == 1 or reason is not None:
        return None
    return span


def plan_resize(
    *,
    model: ModelSpec,
    gpus: int,
    profile: str | None,
    in_place: bool,
    classes: Mapping[str, GPUClassSpec],
    nodes: Iterable[NodeRoom],
    running: int,
    fleet: Fleet | None = None,
    node_count: int | None = None,
) -> Change:
    """The change that spreads ``model``'s profile over ``gpus`` cards, after
    every check of docs/design.md's "Resize", in its order: on one node when one
    holds them, else across the fewest nodes that divide them evenly (or the
    ``node_count`` asked), as the engine spans nodes (``groups``, ``spanplan``).

    Refusals: ``declared`` (409), ``gpus_range``, the profile's
    (``no_profile``, ``cpu_only``, ``ambiguous_profile``), ``unknown_engine``,
    ``unchanged``, ``capability``, ``heads``, ``single_card_engine``,
    ``memory`` (400), and the room's (409). Those after the profile is chosen
    carry ``change``. What could not be checked (an unknown shape, context or
    class) is said once in ``note``, never refused. ``running`` is how many
    replicas the model has running now; ``in_place`` asks to stop each before
    its replacement starts when there is no room beside it.
    """
    _refuse_declared(model)
    if not _is_count(gpus) or not 1 <= gpus <= MAX_CARDS:
        raise DomainError("gpus_range", f"A replica uses 1 to {MAX_CARDS} cards; {gpus!r} was asked for.")

    p = pick_profile(model, profile)
    notes = Notes()
    change = Change(
        model=model.name,
        profile=p.name,
        engine=p.engine,
        gpu_class=p.gpu_class,
        before=p.cards,
        after=gpus,
        kind="gpus",
        args=p.args,
    )
    eng = _engine_of(p, change, notes)
    if p.cards == gpus and (node_count is None or node_count == max(p.nodes, 1)):
        raise DomainError(
            "unchanged",
            f"{model.name}'s {p.name} profile already uses {cards(gpus)}.",
            change=change.as_dict(),
        )
    spec = classes.get(p.gpu_class or "")
    budget = _check_class(eng, p, spec, change, notes)
    nodes = list(nodes)
    span = _span(eng, p, gpus, nodes, node_count, change, notes)

    try:
        new = (
            respread(p, gpus, model.shape, eng) if span is None else respread_group(p, span, model.shape, eng)
        )
    except DomainError as err:
        raise with_change(err, change, notes) from None
    change = replace(change, args=new.args, launch=_launch(eng, model, new), new_profile=new)
    _refuse_forbidden(eng, new, change, notes, context_max=model.context_length)

    if span is not None:
        change = check_group_memory(
            model=model,
            eng=eng,
            p=new,
            span=span,
            context=context_of(model, new, eng),
            budget=budget,
            change=change,
            notes=notes,
            card=card_of(spec),
        )
        change = check_group_room(
            nodes, eng, p, span, in_place=in_place, change=change, notes=notes, fleet=fleet
        )
        return finish(change, notes)
    change = _check_memory(
        model=model,
        eng=eng,
        p=new,
        n=gpus,
        context=context_of(model, new, eng),
        budget=budget,
        change=change,
        notes=notes,
        heads_checked=heads_known(model.shape) if eng.spread == "tensor" else None,
        card=card_of(spec),
    )
    change = _check_room(
        nodes, p, gpus, running=running, in_place=in_place, change=change, notes=notes, fleet=fleet
    )
    return finish(change, notes)


def plan_context(
    *,
    model: ModelSpec,
    tokens: int,
    profile: str | None,
    in_place: bool,
    classes: Mapping[str, GPUClassSpec],
    nodes: Iterable[NodeRoom],
    running: int,
    fleet: Fleet | None = None,
) -> Change:
    """The change that sets the context of ``model``'s profile to ``tokens``:
    the engine's context flag is written (every other spelling of it, its
    environment variable and any TP spelling, which is the launcher's, dropped), then the memory and room checks of a
    resize run at the profile's current card count — a new context needs a
    restart too. ``before`` and ``after`` are tokens.

    Refusals: ``declared`` (409), ``context_range`` (1 to the model's context
    length, when known), the profile's, ``unknown_engine``, ``unchanged``,
    ``capability``, ``memory`` (400) and the room's (409).
    """
    _refuse_declared(model)
    limit = model.context_length
    if not _is_count(tokens) or tokens < 1 or tokens > (limit or MAX_UNKNOWN_CONTEXT):
        allowed = (
            f"1 to {limit} tokens"
            if limit is not None
            else f"1 to {MAX_UNKNOWN_CONTEXT} tokens (the model does not say its own limit)"
        )
        raise DomainError(
            "context_range", f"{model.name}'s context can be {allowed}; {tokens!r} was asked for."
        )

    p = pick_profile(model, profile)
    notes = Notes()
    change = Change(
        model=model.name,
        profile=p.name,
        engine=p.engine,
        gpu_class=p.gpu_class,
        before=None,
        after=tokens,
        kind="context",
        args=p.args,
    )
    eng = _engine_of(p, change, notes)
    before = context_of(model, p, eng)
    change = replace(change, before=before)
    if before == tokens:
        raise DomainError(
            "unchanged",
            f"{model.name}'s {p.name} profile already serves a context of {tokens} tokens.",
            change=change.as_dict(),
        )
    spec = classes.get(p.gpu_class or "")
    budget = _check_class(eng, p, spec, change, notes)

    try:
        # The TP width is the launcher's too (from the profile's tp field): a
        # spelling left from before the launch policy goes with the change.
        args = with_context(eng, drop_spellings(eng, p.args, eng.tp_flags), tokens)
    except DomainError as err:
        raise with_change(err, change, notes) from None
    # The flag now wins over any environment spelling; dropping those keeps
    # the profile from saying two things.
    env = tuple((k, v) for k, v in p.env if k not in eng.context_env)
    new = replace(p, args=tuple(args), env=env)
    change = replace(change, args=new.args, launch=_launch(eng, model, new), new_profile=new)
    _refuse_forbidden(eng, new, change, notes, context_max=model.context_length)

    n = p.cards
    if p.nodes > 1 and span_refusal(eng) is None:
        span = span_of(p)
        change = check_group_memory(
            model=model,
            eng=eng,
            p=new,
            span=span,
            context=tokens,
            budget=budget,
            change=change,
            notes=notes,
            card=card_of(spec),
        )
        change = check_group_room(
            nodes, eng, p, span, in_place=in_place, change=change, notes=notes, fleet=fleet
        )
        return finish(change, notes)
    change = _check_memory(
        model=model,
        eng=eng,
        p=new,
        n=n,
        context=tokens,
        budget=budget,
        change=change,
        notes=notes,
        heads_checked=None,
        card=card_of(spec),
    )
    change = _check_room(
        nodes, p, n, running=running, in_place=in_place, change=change, notes=notes, fleet=fleet
    )
    return finish(change, notes)
