"""What each card holds: its share of the weights, its KV cache for the
context, and the engine's overhead.

A planning model, not a measurement: it decides whether a layout is worth
trying and says by how much it misses.
"""

from __future__ import annotations

from catalog.planning.engines import Engine
from catalog.planning.types import CardMemory, Shape
from catalog.planning.units import ceil_div


def kv_cache_bytes(shape: Shape, context: int) -> int | None:
    """The whole model's KV cache for ``context`` tokens, or None when its
    bytes per token are not known.

    ``kv_bytes_per_token`` counts every layer; a sliding-window layer keeps at
    most ``sliding_window`` tokens, so those layers are counted at
    ``min(context, window)``. With the layer count unknown every layer is
    taken as full.
    """
    per_token = shape.kv_bytes_per_token
    if per_token is None:
        return None
    layers, sliding, window = shape.layers, shape.sliding_layers, shape.sliding_window
    if layers and window is not None and 0 < sliding <= layers:
        full = layers - sliding
        return ceil_div(per_token * (full * context + sliding * min(context, window)), layers)
    return per_token * context


def kv_per_card(engine: Engine, shape: Shape, n: int, kv_total: int) -> int:
    """One card's part of a KV cache of ``kv_total`` bytes over ``n`` cards.

    Layer split: each card keeps its layers' cache, ``kv_total / n``. Tensor
    parallel: each card keeps its KV heads' cache, and no card keeps less
    than one head, so beyond the KV heads (MQA, or GQA on many cards) it
    stops shrinking at ``kv_total / kv_heads``. MLA's latent cache is not
    split by heads at all: every card keeps all of it. With the KV heads
    unknown the cache is taken to split over every card. One card holds all.
    """
    if engine.spread == "single" or n <= 1:
        return kv_total
    if engine.spread == "layers":
        return ceil_div(kv_total, n)
    if shape.attention == "mla":
        return kv_total
    heads = shape.kv_heads if shape.kv_heads and shape.kv_heads > 0 else None
    return ceil_div(kv_total, min(n, heads) if heads else n)


def weights_on_cards(engine: Engine, shape: Shape) -> int | None:
    """The weight bytes that live on the cards: all of them, or without the
    experts for an engine that keeps them in host memory. None when unknown."""
    if shape.weight_bytes is None:
        return None
    experts = 0 if engine.experts_on_card else (shape.expert_bytes or 0)
    return max(shape.weight_bytes - experts, 0)


def card_memory(
    engine: Engine, shape: Shape | None, n: int, context: int | None, budget: int | None
) -> CardMemory | None:
    """What each of ``n`` cards holds for ``context`` tokens, in whole bytes
    (rounded up), against ``budget`` usable bytes a card (None: unknown).

    None when the weights, the KV bytes per token or the context are not
    known: the check is then skipped, and the caller says so.
    """
    if shape is None or context is None or context < 1 or n < 1:
        return None
    weights = weights_on_cards(engine, shape)
    kv_total = kv_cache_bytes(shape, context)
    if weights is None or kv_total is None:
        return None
    shares = 1 if engine.spread == "single" else n
    weights_each = ceil_div(weights, shares)
    kv_each = kv_per_card(engine, shape, n, kv_total)
    overhead = engine.overhead_bytes
    return CardMemory(
        cards=n,
        weights=weights_each,
        kv=kv_each,
        overhead=overhead,
        need=weights_each + kv_each + overhead,
        budget=budget,
        context=context,
    )


def longest_context_that_fits(engine: Engine, shape: Shape, n: int, budget: int, below: int) -> int | None:
    """The most tokens under ``below`` whose cache fits ``budget`` on ``n``
    cards, or None when not even one token does."""
    low, high = 0, below - 1  # low always fits (or is 0), high is the last candidate
    while low < high:
        mid = (low + high + 1) // 2
        memory = card_memory(engine, shape, n, mid, budget)
        if memory is not None and memory.fits:
            low = mid
        else:
            high = mid - 1
    return low or None
