"""The resize rules that are about a profile: which one, how it spreads over
N cards, and what context it serves."""

from __future__ import annotations

from dataclasses import replace

from base.errors import DomainError
from planning.args import parse_int
from planning.engines import Engine, context_arg, drop_spellings
from planning.types import ModelSpec, ProfileSpec, Shape
from planning.units import and_list, cards, or_list

MAX_CARDS = 64


def card_count(p: ProfileSpec) -> int:
    """Cards one replica of ``p`` uses: ``max(gpus_per_node, tp, 1) × max(nodes, pp, 1)``."""
    return p.cards


def pick_profile(model: ModelSpec, named: str | None) -> ProfileSpec:
    """The profile a card-count or context change applies to: the one named,
    or else the model's only profile on cards.

    Refuses (400) a named profile that runs on CPUs (``cpu_only``), a name the
    model has no profile by (``no_profile``), a model with no profile on
    cards (``cpu_only``) and one with several when none is named
    (``ambiguous_profile``).
    """
    if named:
        for p in model.profiles:
            if p.name == named:
                if p.cpu_only:
                    raise DomainError(
                        "cpu_only",
                        f"{model.name}'s {p.name} profile runs on CPUs; give it a GPU class first.",
                    )
                return p
        names = [p.name for p in model.profiles]
        there = f"its profiles are {and_list(names)}" if names else "it has no profiles"
        raise DomainError("no_profile", f"{model.name} has no profile {named!r}; {there}.")

    on_cards = [p for p in model.profiles if not p.cpu_only]
    if not on_cards:
        raise DomainError(
            "cpu_only", f"{model.name} runs on CPUs only; a profile on cards needs a GPU class."
        )
    if len(on_cards) > 1:
        raise DomainError(
            "ambiguous_profile",
            f"{model.name} has several profiles on cards ({and_list([p.name for p in on_cards])}): name one.",
        )
    return on_cards[0]


def _known(n: int | None) -> int | None:
    return n if n is not None and n > 0 else None


def splits_heads(kv_heads: int | None, attention_heads: int | None, n: int) -> bool:
    """Whether tensor parallel can spread the heads over ``n`` cards: ``n``
    divides the KV heads or they divide ``n`` (several cards then share a KV
    head), and ``n`` divides the attention heads.

    A head count that is not known is not checked (the planner notes it).
    """
    kv, attention = _known(kv_heads), _known(attention_heads)
    kv_ok = kv is None or kv % n == 0 or n % kv == 0
    attention_ok = attention is None or attention % n == 0
    return kv_ok and attention_ok


def card_counts_that_split(
    kv_heads: int | None, attention_heads: int | None, *, up_to: int = MAX_CARDS
) -> list[int]:
    """Every card count from 1 to ``up_to`` that ``splits_heads`` accepts."""
    return [n for n in range(1, up_to + 1) if splits_heads(kv_heads, attention_heads, n)]


def heads_known(shape: Shape | None) -> bool:
    """Whether both head counts are known, so that the head split is checked."""
    return (
        shape is not None and _known(shape.kv_heads) is not None and _known(shape.attention_heads) is not None
    )


def _heads_text(kv: int | None, attention: int | None) -> str:
    parts = []
    if _known(kv):
        parts.append(f"{kv} KV heads")
    if _known(attention):
        parts.append(f"{attention} attention heads")
    return and_list(parts)


def respread(profile: ProfileSpec, n: int, shape: Shape | None, engine: Engine) -> ProfileSpec:
    """``profile`` spread over ``n`` cards of one node.

    The engine's TP spellings are dropped from the arguments (and its TP
    environment variables): the launcher sets the width from the profile. A
    tensor-parallel engine gets TP ``n`` if the heads split (400 ``heads``,
    naming the counts that would); llama.cpp splits layers, TP 1 over ``n``
    cards; a single-card engine takes only ``n == 1`` (400
    ``single_card_engine``). Nodes become 1 and PP 0: a replica spanning
    nodes is laid out by hand.
    """
    args = tuple(drop_spellings(engine, profile.args, engine.tp_flags))
    env = tuple((k, v) for k, v in profile.env if k not in engine.tp_env)

    if engine.spread == "tensor":
        kv = shape.kv_heads if shape else None
        attention = shape.attention_heads if shape else None
        if not splits_heads(kv, attention, n):
            would = card_counts_that_split(kv, attention)
            raise DomainError(
                "heads",
                f"The model has {_heads_text(kv, attention)}, which tensor parallel cannot spread over "
                f"{cards(n)}: it needs a count that divides the attention heads and divides, or is a "
                f"multiple of, the KV heads — {or_list(would)}.",
            )
        tp, per_node = n, n
    elif engine.spread == "layers":
        # No tensor parallel: llama.cpp splits the layers over a node's cards.
        tp, per_node = 1, n
    else:
        if n != 1:
            raise DomainError(
                "single_card_engine",
                f"A {engine.name} replica runs on one card; {cards(n)} were asked for. Ask for 1, or give "
                "the profile an engine that spreads over cards.",
            )
        tp, per_node = 1, 1
    return replace(profile, args=args, env=env, tp=tp, gpus_per_node=per_node, nodes=1, pp=0)


def context_of(model: ModelSpec, profile: ProfileSpec, engine: Engine) -> int | None:
    """The tokens a replica of ``profile`` serves: the engine's context flag in
    the arguments (any spelling; the last one wins), else its context
    environment variable, else the model's context length. None when none
    of them is known. A value of 0 or less means "the model's own", as
    llama.cpp reads ``-c 0``."""
    from_args = parse_int(context_arg(engine, profile.args))
    if from_args is not None and from_args > 0:
        return from_args
    from_env = None
    for key, value in profile.env:
        if key in engine.context_env:
            from_env = parse_int(value)
    if from_env is not None and from_env > 0:
        return from_env
    if model.context_length is not None:
        return model.context_length
    return model.shape.context_length if model.shape else None
