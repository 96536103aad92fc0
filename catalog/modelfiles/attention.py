"""Attention from config.json: the KV heads, a head's width, the kind (MHA, GQA,
MQA or MLA), the KV cache a token takes, and which layers keep only a sliding window."""

from __future__ import annotations

from base.notes import Notes
from catalog.modelfiles.fields import KV_HEAD_NAMES, ConfigFields
from catalog.modelfiles.shape import AttentionKind, bad, show

# Engines keep the KV cache at 16 bit by default, and serve float32 weights
# at 16 bit too (vLLM and SGLang cast them down), so the cache is 2 bytes a
# value whatever the weights' dtype.
KV_CACHE_BYTES = 2


def count_kv_heads(cfg: ConfigFields, heads: int | None) -> int | None:
    kv = cfg.count(*KV_HEAD_NAMES)
    if kv is None and cfg.flag("multi_query_attention") is not False:
        # ChatGLM names its KV groups this way, and they count only while
        # multi_query_attention is on.
        kv = cfg.count("multi_query_group_num")
    if kv is None and cfg.flag("multi_query"):
        kv = 1  # Falcon-7B and StarCoder: one K and one V head shared by all
    if kv is None:
        kv = heads  # nothing said: every attention head has its own K and V (MHA)
    if kv is not None and heads is not None and (kv > heads or heads % kv):
        raise bad(
            f"{cfg.source}: {heads} attention heads cannot share {kv} KV heads evenly; "
            f"the attention heads must be a multiple of the KV heads. Correct num_key_value_heads in {cfg.source}."
        )
    return kv


def mla_dims(cfg: ConfigFields) -> tuple[int, int] | None:
    """DeepSeek's multi-head latent attention: (kv_lora_rank, qk_rope_head_dim), when both are given."""
    rank = cfg.count("kv_lora_rank")
    rope = cfg.count("qk_rope_head_dim")
    if rank is None or rope is None:
        return None
    return rank, rope


def derive_head_dim(
    cfg: ConfigFields, hidden: int | None, heads: int | None, mla: tuple[int, int] | None, notes: Notes
) -> int | None:
    explicit = cfg.count("head_dim")
    if explicit is not None:
        return explicit
    if mla is not None:
        # An MLA head's query and key are qk_nope_head_dim + qk_rope_head_dim
        # wide (192 in DeepSeek-V3); hidden_size / heads (56 there) describes
        # nothing in the model.
        nope = cfg.count("qk_nope_head_dim")
        if nope is not None:
            return nope + mla[1]
    if hidden is None or heads is None:
        notes.add(
            f"head_dim unknown: {cfg.source} gives no head_dim, and no hidden_size and heads to derive it from"
        )
        return None
    if hidden % heads:
        notes.add(
            f"hidden_size {hidden} is not a multiple of {heads} heads; head_dim taken as {hidden // heads}"
        )
    return hidden // heads


def attention_kind(
    kv_heads: int | None, heads: int | None, mla: tuple[int, int] | None
) -> AttentionKind | None:
    if mla is not None:
        return "mla"
    if kv_heads is None:
        return None
    if kv_heads == 1:
        return "mqa"
    if heads is None:
        return None
    return "mha" if kv_heads == heads else "gqa"


def kv_bytes_per_token(
    layers: int | None, kv_heads: int | None, head_dim: int | None, mla: tuple[int, int] | None
) -> int | None:
    if layers is None:
        return None
    if mla is not None:
        # MLA caches one compressed latent and one shared rope key per layer,
        # whatever the number of heads.
        rank, rope = mla
        return layers * (rank + rope) * KV_CACHE_BYTES
    if kv_heads is None or head_dim is None:
        return None
    return 2 * layers * kv_heads * head_dim * KV_CACHE_BYTES  # 2: one K and one V


def sliding_window_layers(cfg: ConfigFields, layers: int | None, notes: Notes) -> tuple[int | None, int]:
    """The sliding window and how many layers keep only it."""
    window = cfg.count("sliding_window")
    if cfg.flag("use_sliding_window") is False:
        # Qwen2/Qwen3 configs carry a sliding_window they do not use.
        window = None

    found_types = cfg.find("layer_types")
    if found_types is not None:
        label, types = found_types
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise bad(
                f"{cfg.source}: {label} is {show(types)}, expected a list of layer kinds such as "
                f'"sliding_attention" and "full_attention". Correct it in {cfg.source}.'
            )
        if layers is not None and len(types) != layers:
            raise bad(
                f"{cfg.source}: {label} lists {len(types)} layers but the model has {layers}; "
                f"give one entry a layer in {cfg.source}."
            )
        sliding = types.count("sliding_attention")
        if sliding and window is None:
            notes.add(
                f"{label} marks sliding layers but no sliding window is set; they are counted as full attention"
            )
        return window, sliding if window is not None else 0

    if window is None:
        return None, 0
    if layers is None:
        notes.add("sliding layers unknown: the number of layers is unknown")
        return window, 0
    pattern = cfg.count("sliding_window_pattern")
    if pattern is not None:
        # Every pattern-th layer (the 6th, 12th, ... for gemma-3) is global.
        return window, layers - layers // pattern
    if cfg.flag("use_sliding_window"):
        max_window_layers = cfg.count("max_window_layers", minimum=0)
        if max_window_layers is not None:
            # Qwen2: the layers from max_window_layers up use the window.
            return window, max(0, layers - max_window_layers)
    # A window and nothing saying which layers use it (Mistral-7B-v0.1, Phi-3):
    # every layer slides.
    return window, layers
