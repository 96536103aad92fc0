"""llama.cpp's compute buffer: the graph it reserves for one ubatch, planned from the model's shape
and the profile's arguments (docs/memory-model.md; the coefficients and their sources are
engines.toml's [llamacpp.memory] compute_buffer)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from planning.engineargs import arg_value, int_value
from planning.engines import Engine
from planning.types import Shape, Term
from planning.units import FP32, GIB, ceil_div

FLASH_ATTN_OFF = ("off", "0", "false", "disabled")


def compute_buffer_term(
    eng: Engine, shape: Shape, *, args: Sequence[str] = (), context: int | None = None
) -> Term:
    """llama.cpp's compute buffer on a card: the graph it reserves for one ubatch of ``batch_tokens``
    tokens (at most the context; ubatch_flags, else batch_tokens_default), every token an output, as the larger of its output phase (the fp32
    logits of the vocabulary beside the last layer's live tensors) and its layer phase (the FFN's
    intermediate tensors and the attention mask over the KV cells; with flash attention off, the
    KQ scores of every head). Coefficients: engines.toml [llamacpp.memory] compute_buffer. With the
    vocabulary or hidden size unknown, the flat runtime figure."""
    mem = eng.memory
    c = mem.compute_buffer
    source = mem.sources.get("activation", "")
    vocab, hidden, ffn = shape.vocab_size or 0, shape.hidden_size or 0, shape.intermediate_size or 0
    if not (vocab and hidden):
        return Term(
            "activation",
            round(mem.runtime_gib * GIB),
            f"compute buffer: model size unknown (vocabulary, hidden size), the flat {mem.runtime_gib:g} GiB",
            source,
        )
    cells = ceil_div(context, mem.kv_block) * mem.kv_block if context else 0
    given = next((v for v in (int_value(eng, args, f) for f in mem.ubatch_flags) if v), None)
    ubatch = given or mem.batch_tokens_default
    ubatch = min(ubatch, cells) if cells else ubatch
    outputs = ubatch * c.get("logits_outputs", 1.0)
    out = FP32 * (
        outputs * vocab + ubatch * (c.get("hidden_out", 0.0) * hidden + c.get("ffn_out", 0.0) * ffn)
    )
    layer = FP32 * ubatch * (c.get("ffn_layer", 0.0) * ffn + c.get("hidden_layer", 0.0) * hidden)
    layer += ubatch * cells * c.get("mask_bytes", 0.0)
    flash = next((v for v in (arg_value(eng, args, f) for f in mem.flash_attn_flags) if v is not None), None)
    flash_off = flash is not None and flash.lower() in FLASH_ATTN_OFF
    heads = shape.attention_heads or 0
    if flash_off:
        layer += ubatch * cells * heads * c.get("kq_bytes", 0.0)
    if out >= layer:
        how = f"compute buffer, output phase: {outputs:g} outputs x {vocab} vocabulary fp32 logits beside the last layer's tensors ({ubatch}-token ubatch)"
    else:
        how = f"compute buffer, layer phase: {ubatch}-token ubatch over {cells} KV cells" + (
            f", {heads} heads' attention scores (flash attention off)" if flash_off else ""
        )
    return Term("activation", math.ceil(max(out, layer)), how, source)
