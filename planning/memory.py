"""What each card holds: its share of the weights, its KV cache for the
context at the engine's own allowance, and each term the engine holds beside
them (activation peak, memory outside PyTorch, communication buffers, CUDA
graphs), against the engine's own budget capped by the card class.

The terms and their figures are the engine's registry entry
(``[<engine>.memory]`` in ``engines.toml``, with their sources); this module
only does the arithmetic. A planning model: tests/planning/calibration.py holds it to
logged engine start-ups (docs/memory-model.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from planning.computebuffer import compute_buffer_term
from planning.engineargs import arg_value, flag_given, float_value, int_value
from planning.enginememory import EngineMemory
from planning.engines import Engine
from planning.types import CardMemory, Shape, Term
from planning.units import FP32, GIB, ceil_div, gib

MODEL_DTYPE = 2  # activations are in the serving dtype, 16 bits for every engine here
MIB = 2**20


def _large(mem: EngineMemory, total: int | None, class_name: str) -> bool:
    return (
        total is not None
        and total >= mem.large_card_gib * GIB
        and not any(part in class_name.lower() for part in mem.large_card_except)
    )


def batch_tokens(eng: Engine, args: Sequence[str], total: int | None, class_name: str = "") -> int:
    """The engine's batch-token limit: its flag, else its default for the card."""
    mem = eng.memory
    given = int_value(eng, args, mem.batch_tokens_flag)
    if given:
        return given
    if mem.batch_tokens_default_large and _large(mem, total, class_name):
        return mem.batch_tokens_default_large
    return mem.batch_tokens_default


def max_seqs(eng: Engine, args: Sequence[str], total: int | None, class_name: str = "") -> int:
    mem = eng.memory
    given = int_value(eng, args, mem.max_seqs_flag)
    if given:
        return given
    if mem.max_seqs_default_large and _large(mem, total, class_name):
        return mem.max_seqs_default_large
    return mem.max_seqs_default


def kv_dtype_factor(eng: Engine, args: Sequence[str]) -> float:
    """Bytes a cached value takes over the 2 the shape's figure assumes
    (``--kv-cache-dtype fp8`` halves the cache). Several flags (llama.cpp's
    K and V types) each cover their share."""
    mem = eng.memory
    if not mem.kv_dtype_flags:
        return 1.0
    auto = mem.kv_dtype_bytes.get("auto", 2.0)
    parts = []
    for flag in mem.kv_dtype_flags:
        value = arg_value(eng, args, flag)
        parts.append(mem.kv_dtype_bytes.get(value, auto) if value is not None else auto)
    return sum(parts) / len(parts) / 2.0


def kv_cache_bytes(shape: Shape, context: int) -> int | None:
    """The whole model's KV cache for ``context`` tokens with sliding-window
    layers kept at ``min(context, window)``, or None when the bytes per token
    are not known. (The engine-faithful figure is ``kv_per_card``.)"""
    per_token = shape.kv_bytes_per_token
    if per_token is None:
        return None
    layers, sliding, window = shape.layers, shape.sliding_layers, shape.sliding_window
    if layers and window is not None and 0 < sliding <= layers:
        full = layers - sliding
        return ceil_div(per_token * (full * context + sliding * min(context, window)), layers)
    return per_token * context


def _kv_split(eng: Engine, shape: Shape, n: int) -> int:
    """How many ways the cache splits over ``n`` cards: by layers for
    llama.cpp, by KV heads (never below one a card) for tensor parallel, not
    at all for MLA's latent or one card."""
    if eng.spread == "single" or n <= 1:
        return 1
    if eng.spread == "layers":
        return n
    if shape.attention == "mla":
        return 1
    heads = shape.kv_heads if shape.kv_heads and shape.kv_heads > 0 else None
    return min(n, heads) if heads else n


def _sliding_tokens(mem: EngineMemory, context: int, window: int, batch: int) -> tuple[int, str]:
    block = mem.kv_block
    if mem.sliding == "batch":
        kept = min(window - 1 + batch, context)
        return (ceil_div(kept, block) + 1) * block, (
            f"min(window {window} - 1 + {batch} batch tokens, {context}) + 1 block"
        )
    if mem.sliding == "window":
        return ceil_div(min(context, window), block) * block, f"min({context}, window {window})"
    return ceil_div(context, block) * block, f"all {context} (the engine keeps sliding layers whole)"


def _grouped_layers(mem: EngineMemory, full: int, sliding: int) -> tuple[int, int, int]:
    """Full and sliding layer slots once the engine has grouped a hybrid
    model's layers (engines.toml kv_group_ratio), and the group size."""
    if not mem.kv_group_ratio or full <= 0 or sliding <= 0:
        return full, sliding, 0
    size = min(full, sliding)
    if max(full, sliding) < size * mem.kv_group_ratio:
        size = max(full, sliding)
    return ceil_div(full, size) * size, ceil_div(sliding, size) * size, size


def kv_per_card(
    eng: Engine, shape: Shape, n: int, context: int, *, args: Sequence[str] = (), batch: int | None = None
) -> tuple[int, str] | None:
    """One card's KV cache for ``context`` tokens, as the engine allocates it
    for one full-length sequence, with the sentence saying how; None when the
    bytes per token are unknown."""
    per_token = shape.kv_bytes_per_token
    if per_token is None:
        return None
    block = int_value(eng, args, eng.memory.kv_block_flag) or eng.memory.kv_block
    mem = replace(eng.memory, kv_block=block)
    factor = kv_dtype_factor(eng, args)
    full_tokens = ceil_div(context, block) * block
    layers, sliding, window = shape.layers, shape.sliding_layers, shape.sliding_window
    how = [f"{context} tokens in blocks of {block}"]
    if layers and window is not None and 0 < sliding <= layers:
        kept, said = _sliding_tokens(mem, context, window, batch or context)
        full_slots, sliding_slots, size = _grouped_layers(mem, layers - sliding, sliding)
        total = per_token * (full_slots * full_tokens + sliding_slots * kept) / layers
        how.append(f"{sliding} of {layers} sliding layers keep {said}")
        padding = full_slots + sliding_slots - layers
        if padding:
            how.append(f"{padding} padding layer{'s' if padding > 1 else ''} to groups of {size}")
    else:
        total = per_token * full_tokens
    if factor != 1.0:
        how.append(f"cache dtype at {factor * 2:g} bytes a value")
    split = _kv_split(eng, shape, n)
    if split > 1:
        how.append(f"split {split} ways")
    elif n > 1:
        how.append("whole on every card" if shape.attention == "mla" else "not split")
    return math.ceil(total * factor / split), ", ".join(how)


def weights_on_cards(eng: Engine, shape: Shape) -> int | None:
    """The weight bytes that live on the cards: all of them, or without the
    experts for an engine that keeps them in host memory. None when unknown."""
    if shape.weight_bytes is None:
        return None
    experts = 0 if eng.experts_on_card else (shape.expert_bytes or 0)
    return max(shape.weight_bytes - experts, 0)


def expert_padding(eng: Engine, shape: Shape, tp: int) -> float:
    """How much larger one card's routed-expert tensors are than their share
    of the weights: engines pad some formats' expert width (per card) and
    hidden size to a kernel's multiple (engines.toml expert_padding). 1 when
    nothing is padded or the sizes are unknown."""
    rule = eng.memory.expert_padding.get(shape.expert_format or "")
    width, hidden = shape.expert_intermediate_size, shape.hidden_size
    if rule is None or not width or not hidden or not shape.expert_bytes or not eng.experts_on_card:
        return 1.0
    width_multiple, hidden_multiple = rule
    per_card = width // tp
    if per_card < 1:
        return 1.0
    return (ceil_div(per_card, width_multiple) * width_multiple / (width / tp)) * (
        ceil_div(hidden, hidden_multiple) * hidden_multiple / hidden
    )


def weights_per_card(eng: Engine, shape: Shape, n: int) -> int | None:
    """One card's share: the split part over ``n``, plus the replicated part
    whole on each card of a tensor-parallel replica, with the routed experts
    as large as the engine pads them."""
    weights = weights_on_cards(eng, shape)
    if weights is None:
        return None
    if eng.spread == "single" or n <= 1:
        tp = 1
    elif eng.spread == "layers":
        return ceil_div(weights, n)
    else:
        tp = n
    padding = expert_padding(eng, shape, tp)
    experts = min(shape.expert_bytes or 0, weights) if padding != 1.0 else 0
    replicated = min(shape.replicated_bytes, weights - experts) if tp > 1 else 0
    rest = weights - experts - replicated
    return ceil_div(rest, tp) + math.ceil(experts / tp * padding) + replicated


def engine_budget(
    eng: Engine,
    *,
    total: int | None,
    usable: int | None,
    n: int,
    args: Sequence[str] = (),
    held: int = 0,
    before_weights: int = 0,
) -> tuple[int | None, str, Term | None]:
    """(what the engine may fill a card with, how, a term it keeps outside).

    The engine's own budget from its flag or default, capped by the class's
    usable memory. With the card's total unknown, the class's usable memory.
    ``held`` is what the card holds before the KV cache (weights and the
    terms beside them): a "free_fraction" engine (TensorRT-LLM) gives its
    cache that fraction of what is left after them. ``before_weights`` is what
    the card holds before the weights load (the terms inside the budget): SGLang
    takes its fraction of what is free then, not of the total.
    """
    mem = eng.memory
    rule = mem.budget_rule
    source = mem.sources.get("budget", "")
    outside = None
    fit = next((v for v in (arg_value(eng, args, f) for f in mem.fit_flags) if v is not None), None)
    if rule == "none" and total and fit is not None and fit.lower() in ("on", "1", "true"):
        # llama.cpp --fit on: it fits its layers and buffers to the card, leaving the target free.
        margin = float_value(eng, args, mem.fit_target_flag)
        margin_mib = margin if margin is not None and margin >= 0 else mem.fit_target_default_mib
        own = total - round(margin_mib * MIB)
        how = f"{gib(total, 2)} GiB less {mem.fit_target_flag} {margin_mib:g} MiB ({mem.fit_flags[0]} {fit})"
        if usable is not None and usable < own:
            how += f", capped by the class's {gib(usable, 2)} GiB usable"
            own = usable
        return own, how, None
    if rule == "none" or not total:
        how = "the class's usable memory"
        return usable, how, None
    given = float_value(eng, args, mem.budget_flag)
    pool = int_value(eng, args, mem.kv_pool_flag)
    if rule == "fraction" and pool is not None:
        # The engine sizes its KV cache from the flag and ignores the fraction.
        own = held + pool
        how = (
            f"{gib(held, 2)} GiB held + the KV pool {mem.kv_pool_flag} {gib(pool, 2)} GiB "
            f"({mem.budget_flag} is not used)"
        )
    elif rule == "fraction":
        fraction = given if given is not None and 0 < given <= 1 else mem.budget_default
        own = int(total * fraction)
        how = f"{gib(total, 2)} GiB x {mem.budget_flag} {fraction:g}"
    elif rule == "free_fraction":
        fraction = given if given is not None and 0 < given <= 1 else mem.budget_default
        free = max(total - held, 0)
        own = held + int(free * fraction)
        how = (
            f"{gib(held, 2)} GiB held + {mem.budget_flag} {fraction:g} x the "
            f"{gib(free, 2)} GiB left of {gib(total, 2)} GiB"
        )
    else:  # sglang: weights and KV pool fill the fraction of what was free before the weights loaded
        if given is not None and 0 < given <= 1:
            fraction = given
            how = f"{gib(before_weights, 2)} GiB held before the weights + {mem.budget_flag} {fraction:g}"
        else:
            fraction = sglang_fraction(total, n)
            how = (
                f"{gib(before_weights, 2)} GiB held before the weights + {mem.budget_flag} {fraction:g} "
                f"(SGLang's default for this card at TP {n})"
            )
        free = max(total - before_weights, 0)
        own = before_weights + int(free * fraction)
        how += f" x the {gib(free, 2)} GiB then free of {gib(total, 2)} GiB"
        outside = Term(
            name="reserved",
            bytes=total - own,
            how=f"(total - held before the weights) x (1 - {fraction:g}): activations and CUDA graphs, "
            "outside the static pool",
            source=source,
            inside=False,
        )
    if usable is not None and usable < own:
        how += f", capped by the class's {gib(usable, 2)} GiB usable"
        own = usable
    return own, how, outside


def sglang_fraction(total: int, tp: int, pp: int = 1) -> float:
    """SGLang's default ``mem_fraction_static`` for a card of ``total`` bytes
    (server_args.py ``_handle_gpu_memory_settings``, CUDA, no speculative
    decoding or DP attention)."""
    mb = total / MIB
    if mb < 20 * 1024:
        chunked, graph_bs = 2048, 8
    elif mb < 35 * 1024:
        chunked, graph_bs = 2048, (24 if tp < 4 else 80)
    elif mb < 60 * 1024:
        chunked, graph_bs = 4096, (32 if tp < 4 else 160)
    elif mb < 160 * 1024:
        chunked, graph_bs = 8192, (256 if tp < 4 else 512)
    else:
        chunked, graph_bs = 16384, 512
    reserved = 512 + max(chunked, 2048) * 1.5 + graph_bs * 2 + tp * pp / 8 * 1024
    if mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((mb - reserved) / mb, 3)


def moe_forward(mem: EngineMemory, shape: Shape, tp: int, batch: int) -> tuple[float, str] | None:
    """The fused-MoE kernel's workspaces a batch token, in model-dtype elements (averaged over the
    batch when the kernel works in chunks of ``activation_moe_chunk`` tokens), and how; None for a
    dense model, an engine without the term, or a shape that does not say its experts' width and
    how many a token goes through. vLLM's TritonExperts.workspace_shapes: workspace1 (tokens,
    experts a token, max(N / 2, K)), workspace2 (tokens, experts a token, max(N, K)) and the output
    (tokens, K), N the gate and up projections' 2 x expert width / TP, K the hidden size; the
    engine's workspace manager keeps them after the forward pass, so they sit beside the sampler's
    peak too (engines.toml sources.activation)."""
    width, active, hidden = shape.expert_intermediate_size, shape.experts_per_token, shape.hidden_size
    if not mem.activation_moe or not width or not active or not hidden or batch < 1:
        return None
    per_card = width / tp
    rows = min(batch, mem.activation_moe_chunk) / batch
    elements = (
        mem.activation_moe * rows * (active * (max(per_card, hidden) + max(2 * per_card, hidden)) + hidden)
    )
    how = (
        f"{mem.activation_moe:g} x ({active} experts a token x (max({width}/{tp}, {hidden}) + "
        f"max(2 x {width}/{tp}, {hidden})) + {hidden})"
        + (f" over chunks of {mem.activation_moe_chunk}" if rows < 1 else "")
    )
    return elements, how


def overhead_terms(
    eng: Engine,
    shape: Shape,
    n: int,
    *,
    args: Sequence[str] = (),
    total: int | None = None,
    class_name: str = "",
    context: int | None = None,
) -> list[Term]:
    """Each term the engine holds beside weights and KV cache on each of ``n``
    cards, in the registry's order, the terms it does not use left out.
    ``context`` is the KV cache's length (llama.cpp's compute buffer grows with it)."""
    mem = eng.memory
    terms: list[Term] = []
    tp = n if eng.spread == "tensor" else 1
    if mem.compute_buffer:
        terms.append(compute_buffer_term(eng, shape, args=args, context=context))
    elif mem.activation_ffn or mem.activation_hidden or mem.sampler_copies:
        batch = batch_tokens(eng, args, total, class_name)
        seqs = min(max_seqs(eng, args, total, class_name), batch)
        hidden = shape.hidden_size or 0
        ffn = shape.intermediate_size or 0
        # At TP > 1 each row-parallel layer's all-reduce writes a new
        # hidden-sized tensor beside its input (activation_hidden_tp).
        hidden_copies = mem.activation_hidden + (mem.activation_hidden_tp if tp > 1 else 0.0)
        dense = mem.activation_ffn * ffn / tp
        moe = moe_forward(mem, shape, tp, batch)
        widest = max(dense, moe[0] if moe else 0.0)
        forward = batch * MODEL_DTYPE * (widest + hidden_copies * hidden)
        # The MoE workspaces outlive the forward pass: the sampler's run peaks on top of them.
        kept = batch * MODEL_DTYPE * moe[0] if moe else 0.0
        sampler = mem.sampler_copies * seqs * (shape.vocab_size or 0) * FP32 + kept
        if forward >= sampler:
            ffn_how = moe[1] if moe and moe[0] > dense else f"{mem.activation_ffn:g} x {ffn}/{tp}"
            how = (
                f"forward pass of {batch} batch tokens: {batch} x 2 bytes x "
                f"({ffn_how} + {hidden_copies:g} x {hidden})"
            )
        else:
            how = (
                f"sampler: {mem.sampler_copies:g} x {seqs} sequences x {shape.vocab_size} vocabulary x 4 bytes"
                + (
                    f", beside the MoE workspaces kept from the forward pass ({batch} x 2 bytes x {moe[1]})"
                    if moe
                    else ""
                )
            )
        if not (hidden or ffn or shape.vocab_size):
            how = "model size unknown (hidden, intermediate and vocabulary sizes): counted as 0"
        terms.append(
            Term("activation", math.ceil(max(forward, sampler)), how, mem.sources.get("activation", ""))
        )
    if mem.non_torch_gib:
        terms.append(
            Term(
                "non_torch",
                round(mem.non_torch_gib * GIB),
                "cuBLAS and CUDA runtime",
                mem.sources["non_torch"],
            )
        )
    big_card = total is None or total >= mem.comm_buffers_min_card_gib * GIB
    if mem.comm_buffers_gib and tp > 1 and big_card:
        terms.append(
            Term(
                "comm_buffers",
                round(mem.comm_buffers_gib * GIB),
                f"at TP {tp}"
                + (f" on cards of {mem.comm_buffers_min_card_gib:g} GiB or more" if total else ""),
                mem.sources["comm_buffers"],
            )
        )
    graphs = _graph_term(eng, shape, n, args)
    if graphs is not None:
        terms.append(graphs)
    if mem.runtime_gib and not mem.compute_buffer:
        terms.append(
            Term("runtime", round(mem.runtime_gib * GIB), "flat planning figure", mem.sources["runtime"])
        )
    return terms


def _graph_term(eng: Engine, shape: Shape, n: int, args: Sequence[str]) -> Term | None:
    """The captured CUDA graphs: a flat figure, a share of the card's weights and a figure a layer
    (engines.toml cuda_graph_*); None when the engine has no such term or an eager flag is given."""
    mem = eng.memory
    if not (mem.cuda_graph_gib or mem.cuda_graph_per_weight or mem.cuda_graph_per_layer):
        return None
    if any(flag_given(eng, args, f) for f in mem.eager_flags):
        return None
    weights = weights_per_card(eng, shape, n) or 0
    layers = shape.layers or 0
    parts = [f"{mem.cuda_graph_gib:g} GiB"]
    if mem.cuda_graph_per_weight:
        parts.append(f"{mem.cuda_graph_per_weight:g} x the card's weights")
    if mem.cuda_graph_per_layer:
        parts.append(f"{mem.cuda_graph_per_layer:g} GiB x {layers} layers")
    size = (
        mem.cuda_graph_gib * GIB
        + mem.cuda_graph_per_weight * weights
        + mem.cuda_graph_per_layer * layers * GIB
    )
    return Term(
        "cuda_graph",
        round(size),
        "captured graphs"
        + (": " + " + ".join(parts) if len(parts) > 1 else "")
        + ("" if mem.cuda_graph_inside else ", after the KV cache is sized: outside the budget"),
        mem.sources["cuda_graph"],
        inside=mem.cuda_graph_inside,
    )


def card_memory(
    engine: Engine,
    shape: Shape | None,
    n: int,
    context: int | None,
    budget: int | None,
    *,
    total: int | None = None,
    args: Sequence[str] = (),
    class_name: str = "",
) -> CardMemory | None:
    """What each of ``n`` cards holds for ``context`` tokens, in whole bytes
    (rounded up). ``budget`` is the class's usable bytes a card and ``total``
    the card's whole memory (None: unknown); ``args`` the profile's arguments
    the engine reads its budget, batch and cache flags from.

    None when the weights, the KV bytes per token or the context are not
    known: the check is then skipped, and the caller says so.
    """
    if shape is None or context is None or context < 1 or n < 1:
        return None
    weights_each = weights_per_card(engine, shape, n)
    batch = batch_tokens(engine, args, total, class_name)
    kv = kv_per_card(engine, shape, n, context, args=args, batch=batch)
    if weights_each is None or kv is None:
        return None
    kv_each, _ = kv
    terms = overhead_terms(engine, shape, n, args=args, total=total, class_name=class_name, context=context)
    inside = sum(t.bytes for t in terms if t.inside)
    own, how, outside = engine_budget(
        engine, total=total, usable=budget, n=n, args=args, held=weights_each + inside, before_weights=inside
    )
    if outside is not None:
        terms.append(outside)
    overhead = sum(t.bytes for t in terms if t.inside)
    need = weights_each + kv_each + overhead
    kv_tokens = sequences = None
    if own is not None and kv_each > 0:
        room = own - weights_each - overhead
        per_token = kv_each / context
        kv_tokens = max(int(room / per_token), 0)
        sequences = round(max(room, 0) / kv_each, 2)
    return CardMemory(
        cards=n,
        weights=weights_each,
        kv=kv_each,
        overhead=overhead,
        need=need,
        budget=own,
        context=context,
        terms=tuple(terms),
        engine_budget=own if engine.memory.budget_rule != "none" and total else None,
        class_budget=budget,
        budget_how=how,
        kv_tokens=kv_tokens,
        sequences=sequences,
    )


def longest_context_that_fits(
    engine: Engine,
    shape: Shape,
    n: int,
    budget: int | None,
    below: int,
    *,
    total: int | None = None,
    args: Sequence[str] = (),
    class_name: str = "",
) -> int | None:
    """The most tokens under ``below`` whose cache fits ``budget`` on ``n``
    cards, or None when not even one token does."""
    low, high = 0, below - 1  # low always fits (or is 0), high is the last candidate
    while low < high:
        mid = (low + high + 1) // 2
        memory = card_memory(engine, shape, n, mid, budget, total=total, args=args, class_name=class_name)
        if memory is not None and memory.fits:
            low = mid
        else:
            high = mid - 1
    return low or None
