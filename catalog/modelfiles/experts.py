"""Mixture of experts from config.json: which layers hold routed experts, their
bytes when no safetensors header says, their width and format, and what every
tensor-parallel card holds whole."""

from __future__ import annotations

import math
from fractions import Fraction

from base.notes import Notes
from catalog.modelfiles.fields import EXPERT_NAMES, ConfigFields, whole
from catalog.modelfiles.shape import bad, json_type

# Bytes a routed-expert weight takes under a quantization_config. MXFP4 (as in
# gpt-oss) stores 4-bit values in blocks of 32 sharing one 8-bit scale:
# 4 + 8/32 = 4.25 bits. FP8 block scales (one float per 128x128 block) are under
# 0.03% and left out.
QUANT_BYTES = {"fp8": Fraction(1), "fbgemm_fp8": Fraction(1), "mxfp4": Fraction(17, 32)}


def expert_storage(cfg: ConfigFields) -> tuple[int | None, str | None]:
    """The routed experts' width and quantization method (None for a dense
    model or experts in the weights' dtype)."""
    if not cfg.count(*EXPERT_NAMES, minimum=0):
        return None, None
    # Mixtral and gpt-oss size their experts with intermediate_size.
    intermediate = cfg.count("moe_intermediate_size") or cfg.count("intermediate_size")
    quant = cfg.find("quantization_config")
    method = quant[1].get("quant_method") if quant is not None and isinstance(quant[1], dict) else None
    return intermediate, method if isinstance(method, str) and method else None


def experts_per_token(cfg: ConfigFields) -> int | None:
    """How many routed experts a token goes through (None for a dense model or when the config
    does not say): num_experts_per_tok (Qwen, DeepSeek, Mixtral), experts_per_token (gpt-oss)."""
    if not cfg.count(*EXPERT_NAMES, minimum=0):
        return None
    return cfg.count("num_experts_per_tok", "experts_per_token", "num_experts_per_token")


def activation_sizes(
    cfg: ConfigFields,
    layers: int | None,
    hidden: int | None,
    dtype_bytes: Fraction,
    mla: tuple[int, int] | None,
) -> tuple[int | None, int]:
    """(the widest MLP a token goes through, bytes every TP card holds whole).

    A dense model's MLP is ``intermediate_size`` wide; a token of a MoE model
    goes through ``num_experts_per_tok`` experts of ``moe_intermediate_size``
    (Mixtral and gpt-oss size them with ``intermediate_size``). vLLM keeps
    the MoE router gate (hidden x experts) and MLA's down-projections
    (``q_a_proj``, ``kv_a_proj_with_mqa``) as ReplicatedLinear: whole on each card.
    """
    dense = cfg.count("intermediate_size")
    experts = cfg.count(*EXPERT_NAMES, minimum=0)
    active = cfg.count("num_experts_per_tok", "experts_per_token", "num_experts_per_token")
    moe_width = cfg.count("moe_intermediate_size") or dense
    widths = [w for w in (dense, (active or 0) * (moe_width or 0) if experts else None) if w]
    intermediate = max(widths) if widths else None
    replicated = Fraction(0)
    if hidden and layers:
        if experts:
            replicated += moe_layer_count(cfg, layers) * hidden * experts * dtype_bytes
        if mla is not None:
            q_rank = cfg.count("q_lora_rank") or 0
            replicated += layers * hidden * (mla[0] + mla[1] + q_rank) * dtype_bytes
    return intermediate, math.ceil(replicated)


def derived_expert_bytes(
    cfg: ConfigFields,
    layers: int | None,
    hidden: int | None,
    dtype_bytes: Fraction,
    notes: Notes,
) -> int | None:
    """Routed-expert bytes worked out from the config; None for a dense model or when it cannot be."""
    experts = cfg.count(*EXPERT_NAMES, minimum=0)
    if not experts:
        return None
    # Mixtral and gpt-oss size their experts with intermediate_size.
    intermediate = cfg.count("moe_intermediate_size") or cfg.count("intermediate_size")
    if layers is None or hidden is None or intermediate is None:
        notes.add(
            "expert bytes unknown: the config lacks layers, hidden_size or the experts' intermediate size"
        )
        return None
    moe_layers = moe_layer_count(cfg, layers)

    quant = cfg.find("quantization_config")
    method = None
    if quant is not None:
        label, value = quant
        if not isinstance(value, dict):
            raise bad(
                f"{cfg.source}: {label} is {json_type(value)}, expected an object. Correct it in {cfg.source}."
            )
        method = value.get("quant_method")
    if method is None:
        per_weight = dtype_bytes
    elif method in QUANT_BYTES:
        per_weight = QUANT_BYTES[method]
    else:
        notes.add(f"expert bytes unknown: quantization {method!r} is not one this reader sizes")
        return None

    # Each expert is a gated MLP: gate and up (hidden -> intermediate) and down
    # (intermediate -> hidden). Biases (gpt-oss) are a rounding error.
    weights = experts * moe_layers * 3 * hidden * intermediate
    notes.add(
        f"expert bytes derived from config: {experts} experts x {moe_layers} MoE layers x 3 x {hidden} x "
        f"{intermediate} at {_per_weight_text(per_weight, method)}, not read from the weights"
    )
    # Round up: the memory check would rather be a byte over than under.
    return math.ceil(weights * per_weight)


def moe_layer_count(cfg: ConfigFields, layers: int) -> int:
    """How many layers hold routed experts."""
    # DeepSeek: the first first_k_dense_replace layers are dense, then every
    # moe_layer_freq-th. Qwen-MoE: every decoder_sparse_step-th layer (counting
    # from 1) not in mlp_only_layers. Mixtral and gpt-oss: every layer.
    first_dense = cfg.count("first_k_dense_replace", minimum=0) or 0
    freq = cfg.count("moe_layer_freq") or 1
    step = cfg.count("decoder_sparse_step") or 1
    dense_only: set[int] = set()
    found = cfg.find("mlp_only_layers")
    if found is not None:
        label, value = found
        if not isinstance(value, list):
            raise bad(f"{cfg.source}: {label} is {json_type(value)}, expected a list of layer numbers.")
        dense_only = {whole(v, file=cfg.source, field=label, minimum=0) for v in value}
    return sum(
        1
        for i in range(layers)
        if i >= first_dense and i % freq == 0 and (i + 1) % step == 0 and i not in dense_only
    )


def _per_weight_text(per_weight: Fraction, method: str | None) -> str:
    if method is None:
        return f"{per_weight} bytes a weight"
    bits = per_weight * 8
    return f"{float(bits):g} bits a weight ({method})"
