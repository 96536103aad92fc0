"""A model's shape, read from its Hugging Face checkpoint files.

Pure: ``shape_from_config`` works on already-parsed JSON and ``read_checkpoint``
only reads local files (the safetensors headers, never the tensor data). The
import command and the admin translate a ``CheckpointShape`` into the model's
fields with ``as_fields()``; the memory and heads checks read those fields.

Units: ``weight_bytes`` and ``expert_bytes`` are bytes *in the checkpoint*;
``kv_bytes_per_token`` is the KV cache of the whole model for one token, as if
every layer kept every token (the sliding-window layers that keep fewer are
described by ``sliding_window`` and ``sliding_layers``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from base.errors import DomainError
from base.notes import Notes
from planning.types import SHAPE_FIELDS

__all__ = [
    "MAX_HEADER_BYTES",
    "CheckpointShape",
    "parse_config_bytes",
    "parse_index_bytes",
    "read_checkpoint",
    "read_safetensors_header",
    "shape_from_config",
]

AttentionKind = Literal["mha", "gqa", "mqa", "mla"]

CODE = "bad_checkpoint"
INDEX_NAME = "model.safetensors.index.json"
# Real headers are a few MiB even for models with tens of thousands of tensors;
# a larger length means the file is not safetensors, and reading it would only
# fill memory.
MAX_HEADER_BYTES = 100 * 1024 * 1024

# Each field's spellings, in the order they are tried: transformers' own name
# first, then the GPT-2/Falcon/ChatGLM/T5 ones still found on the Hub.
LAYER_NAMES = ("num_hidden_layers", "n_layer", "num_layers")
HEAD_NAMES = ("num_attention_heads", "n_head", "num_heads")
KV_HEAD_NAMES = ("num_key_value_heads", "num_kv_heads", "n_head_kv")
HIDDEN_NAMES = ("hidden_size", "n_embd", "d_model")
CONTEXT_NAMES = ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions")
EXPERT_NAMES = ("num_local_experts", "num_experts", "n_routed_experts")

# What transformers fills in when a config leaves a field out, for the model
# types whose configs on the Hub rely on it (facts from transformers'
# configuration_gemma3.py, configuration_gemma2.py, configuration_gpt_oss.py
# and configuration_cohere2.py). A pattern of N: every Nth layer attends to the
# full context, the others keep only the window.
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "hidden_size": 2304,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
    },
    "gemma2": {"sliding_window_pattern": 2},
    "gpt_oss": {"sliding_window_pattern": 2},
    "cohere2": {"sliding_window_pattern": 4},
}
# A multimodal config names its text model's type only in text_config, if at all.
TEXT_MODEL_TYPES = {"gemma3": "gemma3_text"}

# Bytes a weight takes in the checkpoint, by dtype. Spellings other than
# transformers' own are seen in hand-written configs.
DTYPE_ALIASES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# Engines keep the KV cache at 16 bit by default, and serve float32 checkpoints
# at 16 bit too (vLLM and SGLang cast them down), so the cache is 2 bytes a
# value whatever the checkpoint's dtype.
KV_CACHE_BYTES = 2
# Bytes a routed-expert weight takes under a quantization_config. MXFP4 (as in
# gpt-oss) stores 4-bit values in blocks of 32 sharing one 8-bit scale:
# 4 + 8/32 = 4.25 bits. FP8 block scales (one float per 128x128 block) are under
# 0.03% and left out.
QUANT_BYTES = {"fp8": Fraction(1), "fbgemm_fp8": Fraction(1), "mxfp4": Fraction(17, 32)}

SHARD_NAME = re.compile(r"-(\d+)-of-(\d+)\.safetensors$")

_ABSENT = object()


@dataclass(frozen=True)
class CheckpointShape:
    """What the checks need to know about a model; None where it is unknown.

    ``notes`` says, once each, what could not be determined or was assumed.
    """

    layers: int | None = None
    attention_heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    dtype: str | None = None
    attention: AttentionKind | None = None
    kv_bytes_per_token: int | None = None
    weight_bytes: int | None = None
    expert_bytes: int | None = None
    sliding_window: int | None = None
    sliding_layers: int = 0
    hidden_size: int | None = None
    intermediate_size: int | None = None
    vocab_size: int | None = None
    replicated_bytes: int = 0
    expert_intermediate_size: int | None = None
    expert_format: str | None = None
    context_length: int | None = None
    notes: tuple[str, ...] = ()

    def as_fields(self) -> dict[str, Any]:
        """The shape and the context length, by the model's field names."""
        return {name: getattr(self, name) for name in (*SHAPE_FIELDS, "context_length")}


def _bad(message: str) -> DomainError:
    return DomainError(CODE, message)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _whole(value: Any, *, file: str, field: str, minimum: int) -> int:
    """``value`` as an int of at least ``minimum``, or a DomainError naming the file and field."""
    # bool is an int in Python but never a count in a config; 32.0 is a count
    # some tools write, 32.5 is not.
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    if number is None or number < minimum:
        wanted = "a whole number greater than zero" if minimum > 0 else "a whole number, zero or more"
        raise _bad(
            f"{file}: {field} is {_show(value)}, expected {wanted}. "
            f"Correct {field} in {file} (compare it with the model's published config.json)."
        )
    return number


class _Config:
    """Looks fields up in a config: the text model's first, then the top level, then the type's defaults."""

    def __init__(self, config: dict[str, Any], source: str):
        self.source = source
        self.top = config
        text = config.get("text_config")
        if text is not None and not isinstance(text, dict):
            raise _bad(
                f"{source}: text_config is {_json_type(text)}, expected an object holding the text model's fields."
            )
        self.text: dict[str, Any] = text or {}
        model_type = self.text.get("model_type")
        if not isinstance(model_type, str):
            top_type = config.get("model_type")
            top_type = top_type if isinstance(top_type, str) else ""
            model_type = TEXT_MODEL_TYPES.get(top_type, top_type) if text is not None else top_type
        self.model_type = model_type
        self.defaults = MODEL_DEFAULTS.get(model_type, {})
        self.defaults_used: dict[str, Any] = {}

    def present(self, name: str) -> bool:
        return name in self.text or name in self.top

    def find(self, *names: str) -> tuple[str, Any] | None:
        """The first of ``names`` given a value, as (label for messages, value); None when none is.

        A field written as null counts as not given; the type's defaults fill
        only fields left out entirely, as transformers does.
        """
        for level, prefix in ((self.text, "text_config."), (self.top, "")):
            for name in names:
                value = level.get(name, _ABSENT)
                if value is not _ABSENT and value is not None:
                    return prefix + name, value
        for name in names:
            if name in self.defaults and not self.present(name):
                self.defaults_used[name] = self.defaults[name]
                return f"{self.model_type} default {name}", self.defaults[name]
        return None

    def count(self, *names: str, minimum: int = 1) -> int | None:
        found = self.find(*names)
        if found is None:
            return None
        label, value = found
        return _whole(value, file=self.source, field=label, minimum=minimum)

    def flag(self, name: str) -> bool | None:
        found = self.find(name)
        if found is None:
            return None
        label, value = found
        if not isinstance(value, bool):
            raise _bad(
                f"{self.source}: {label} is {_show(value)}, expected true or false. Correct it in {self.source}."
            )
        return value


def shape_from_config(
    config: dict[str, Any],
    *,
    index: dict[str, Any] | None = None,
    header: dict[str, Any] | None = None,
    source: str = "config.json",
    index_source: str = INDEX_NAME,
    header_source: str = "safetensors header",
) -> CheckpointShape:
    """The shape a parsed ``config.json`` describes, with the weights from an index or a header.

    ``index`` is a parsed ``model.safetensors.index.json`` (weights from
    ``metadata.total_size``); ``header`` a parsed safetensors header, or the
    union of every shard's (weights and routed-expert weights summed from the
    tensors' ``data_offsets``). Unknown fields are None with a note; a value
    that cannot be right raises DomainError ``bad_checkpoint`` naming the file
    and the field. ``source``, ``index_source`` and ``header_source`` name the
    files in those messages.
    """
    if not isinstance(config, dict):
        raise _bad(f"{source} is {_json_type(config)}, expected a JSON object of the model's settings.")
    cfg = _Config(config, source)
    notes = Notes()

    layers = cfg.count(*LAYER_NAMES)
    heads = cfg.count(*HEAD_NAMES)
    hidden = cfg.count(*HIDDEN_NAMES)
    kv_heads = _kv_heads(cfg, heads)
    mla = _mla_dims(cfg)
    head_dim = _head_dim(cfg, hidden, heads, mla, notes)
    dtype, weight_param_bytes = _dtype(cfg, notes)
    attention = _attention_kind(kv_heads, heads, mla)

    if layers is None:
        notes.add(
            f"layers unknown: {source} gives none of {', '.join(LAYER_NAMES)}; "
            "the KV-cache part of the memory check will be skipped"
        )
    if heads is None:
        notes.add(
            f"attention heads unknown: {source} gives none of {', '.join(HEAD_NAMES)}; "
            "the check that the GPU count divides the heads will be skipped"
        )
    kv_bytes = _kv_bytes_per_token(layers, kv_heads, head_dim, mla)
    if kv_bytes is None:
        notes.add("KV cache per token unknown: the memory check will count weights and overhead only")

    sliding_window, sliding_layers = _sliding(cfg, layers, notes)
    # max_position_embeddings as written, rope_scaling notwithstanding: YaRN
    # checkpoints that ship scaled (DeepSeek-V3: 4096 x 40 = 163840, gpt-oss)
    # already say the scaled length there, and one whose rope_scaling an
    # operator adds by hand should have its context raised by hand too.
    context = cfg.count(*CONTEXT_NAMES)
    if context is None:
        notes.add(
            f"context length unknown: {source} gives none of {', '.join(CONTEXT_NAMES)}; set it by hand"
        )

    tensor_bytes, expert_tensor_bytes = (
        (None, None) if header is None else _header_sums(header, header_source)
    )
    weight_bytes = _index_total_size(index, index_source) if index is not None else None
    if weight_bytes is None and tensor_bytes is not None:
        weight_bytes = tensor_bytes
    if weight_bytes is None:
        if index is not None:
            notes.add(
                f"weight bytes unknown: {index_source} has no metadata.total_size; the memory check will be skipped"
            )
        else:
            notes.add(
                "weight bytes unknown: no safetensors index or header was given; the memory check will be skipped"
            )

    expert_bytes = expert_tensor_bytes or None
    if expert_bytes is None:
        expert_bytes = _derived_expert_bytes(cfg, layers, hidden, weight_param_bytes, notes)

    intermediate, replicated = _activation_sizes(cfg, layers, hidden, weight_param_bytes, mla)
    expert_intermediate, expert_format = _expert_storage(cfg)

    if cfg.defaults_used:
        used = ", ".join(f"{name} {value}" for name, value in cfg.defaults_used.items())
        notes.add(f"{source} leaves out fields transformers fills with {cfg.model_type} defaults: {used}")

    return CheckpointShape(
        layers=layers,
        attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        attention=attention,
        kv_bytes_per_token=kv_bytes,
        weight_bytes=weight_bytes,
        expert_bytes=expert_bytes,
        sliding_window=sliding_window,
        sliding_layers=sliding_layers,
        context_length=context,
        hidden_size=hidden,
        intermediate_size=intermediate,
        vocab_size=cfg.count("vocab_size", "padded_vocab_size"),
        replicated_bytes=replicated,
        expert_intermediate_size=expert_intermediate,
        expert_format=expert_format,
        notes=notes.as_tuple(),
    )


def _expert_storage(cfg: _Config) -> tuple[int | None, str | None]:
    """The routed experts' width and quantization method (None for a dense
    model or experts in the checkpoint's dtype)."""
    if not cfg.count(*EXPERT_NAMES, minimum=0):
        return None, None
    # Mixtral and gpt-oss size their experts with intermediate_size.
    intermediate = cfg.count("moe_intermediate_size") or cfg.count("intermediate_size")
    quant = cfg.find("quantization_config")
    method = quant[1].get("quant_method") if quant is not None and isinstance(quant[1], dict) else None
    return intermediate, method if isinstance(method, str) and method else None


def _activation_sizes(
    cfg: _Config, layers: int | None, hidden: int | None, dtype_bytes: Fraction, mla: tuple[int, int] | None
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
            replicated += _moe_layer_count(cfg, layers) * hidden * experts * dtype_bytes
        if mla is not None:
            q_rank = cfg.count("q_lora_rank") or 0
            replicated += layers * hidden * (mla[0] + mla[1] + q_rank) * dtype_bytes
    return intermediate, math.ceil(replicated)


def _kv_heads(cfg: _Config, heads: int | None) -> int | None:
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
        raise _bad(
            f"{cfg.source}: {heads} attention heads cannot share {kv} KV heads evenly; "
            f"the attention heads must be a multiple of the KV heads. Correct num_key_value_heads in {cfg.source}."
        )
    return kv


def _mla_dims(cfg: _Config) -> tuple[int, int] | None:
    """DeepSeek's multi-head latent attention: (kv_lora_rank, qk_rope_head_dim), when both are given."""
    rank = cfg.count("kv_lora_rank")
    rope = cfg.count("qk_rope_head_dim")
    if rank is None or rope is None:
        return None
    return rank, rope


def _head_dim(
    cfg: _Config, hidden: int | None, heads: int | None, mla: tuple[int, int] | None, notes: Notes
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


def _dtype(cfg: _Config, notes: Notes) -> tuple[str | None, Fraction]:
    """The checkpoint's dtype name and bytes a weight, assuming 2 when unknown."""
    # Newer transformers write "dtype"; older ones "torch_dtype".
    found = cfg.find("dtype") or cfg.find("torch_dtype")
    if found is None:
        notes.add(
            f"dtype unknown: {cfg.source} gives neither dtype nor torch_dtype; 16-bit (2 bytes a value) assumed"
        )
        return None, Fraction(2)
    label, value = found
    if not isinstance(value, str) or not value.strip() or len(value) > 32:
        raise _bad(
            f'{cfg.source}: {label} is {_show(value)}, expected a dtype name such as "bfloat16". '
            f"Correct it in {cfg.source}."
        )
    name = value.strip().removeprefix("torch.")
    canonical = DTYPE_ALIASES.get(name.lower())
    if canonical is None:
        notes.add(f"dtype {name!r} not known: 2 bytes a weight assumed")
        return name, Fraction(2)
    return canonical, Fraction(DTYPE_BYTES[canonical])


def _attention_kind(
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


def _kv_bytes_per_token(
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


def _sliding(cfg: _Config, layers: int | None, notes: Notes) -> tuple[int | None, int]:
    """The sliding window and how many layers keep only it."""
    window = cfg.count("sliding_window")
    if cfg.flag("use_sliding_window") is False:
        # Qwen2/Qwen3 configs carry a sliding_window they do not use.
        window = None

    found_types = cfg.find("layer_types")
    if found_types is not None:
        label, types = found_types
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise _bad(
                f"{cfg.source}: {label} is {_show(types)}, expected a list of layer kinds such as "
                f'"sliding_attention" and "full_attention". Correct it in {cfg.source}.'
            )
        if layers is not None and len(types) != layers:
            raise _bad(
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


def _index_total_size(index: Any, name: str) -> int | None:
    """``metadata.total_size`` of a parsed safetensors index; None when absent."""
    if not isinstance(index, dict):
        raise _bad(f"{name} is {_json_type(index)}, expected a JSON object with metadata and weight_map.")
    metadata = index.get("metadata")
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise _bad(f"{name}: metadata is {_json_type(metadata)}, expected an object holding total_size.")
    total = metadata.get("total_size")
    if total is None:
        return None
    if isinstance(total, str) and total.isascii() and total.isdigit():
        total = int(total)
    if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
        raise _bad(
            f"{name}: metadata.total_size is {_show(total)}, expected the checkpoint's size in bytes as a whole "
            f"number greater than zero. Download {name} again or correct metadata.total_size."
        )
    return total


def _header_sums(header: Any, name: str) -> tuple[int, int]:
    """(all tensor bytes, routed-expert tensor bytes) of a parsed safetensors header."""
    if not isinstance(header, dict):
        raise _bad(f"{name} is {_json_type(header)}, expected a JSON object of tensors.")
    total = experts = 0
    tensors = 0
    for tensor, entry in header.items():
        if tensor == "__metadata__":
            continue
        start, end = _data_offsets(tensor, entry, name)
        tensors += 1
        total += end - start
        # Routed experts only: DeepSeek's "shared_experts" and Qwen's
        # "shared_expert" run for every token like any dense weight.
        if ".experts." in tensor and "shared_expert" not in tensor:
            experts += end - start
    if not tensors or not total:
        raise _bad(
            f"{name} lists no tensor data; it holds no weights. Check that it is the model's weights file."
        )
    return total, experts


def _data_offsets(tensor: str, entry: Any, name: str) -> tuple[int, int]:
    offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        and offsets[0] <= offsets[1]
    ):
        raise _bad(
            f"{name}: tensor {tensor!r} has data_offsets {_show(offsets)}, expected [start, end] with "
            f"0 <= start <= end. The file is damaged; download it again."
        )
    return offsets[0], offsets[1]


def _derived_expert_bytes(
    cfg: _Config,
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
    moe_layers = _moe_layer_count(cfg, layers)

    quant = cfg.find("quantization_config")
    method = None
    if quant is not None:
        label, value = quant
        if not isinstance(value, dict):
            raise _bad(
                f"{cfg.source}: {label} is {_json_type(value)}, expected an object. Correct it in {cfg.source}."
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


def _moe_layer_count(cfg: _Config, layers: int) -> int:
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
            raise _bad(f"{cfg.source}: {label} is {_json_type(value)}, expected a list of layer numbers.")
        dense_only = {_whole(v, file=cfg.source, field=label, minimum=0) for v in value}
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


# ---- Uploaded and local files ---------------------------------------------


# A config.json is a few kB and a safetensors index a few MB: beyond these a file is not one (or is
# built to exhaust the parser), and is refused with a sentence before or while it is parsed.
MAX_JSON_BYTES = 16 * 1024 * 1024
MAX_JSON_DIGITS = 30  # an integer in a model's settings: no count or size needs more


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_DIGITS:
        raise _bad(
            f"a number of {len(text.lstrip('-'))} digits, more than the {MAX_JSON_DIGITS} any model setting "
            "needs: the file is not a model's settings as published."
        )
    return int(text)


def _parse_json_object(data: bytes, name: str, what: str, *, limit: int = MAX_JSON_BYTES) -> dict[str, Any]:
    if len(data) > limit:
        raise _bad(
            f"{name} is {len(data)} bytes, over the {limit // 2**20} MiB such a file may be: "
            "it is not the file the model publishes."
        )
    try:
        text = data.decode("utf-8-sig")  # tolerate a byte-order mark from Windows editors
    except UnicodeDecodeError as exc:
        raise _bad(
            f"{name} is not UTF-8 text (bad byte at offset {exc.start}); upload the file as downloaded."
        ) from exc
    try:
        value = json.loads(text, parse_int=_json_int)
    except DomainError as exc:
        raise _bad(f"{name} holds {exc.message}") from None
    except RecursionError:
        raise _bad(
            f"{name} nests its values too deeply to read (hundreds of levels): no model's settings do."
        ) from None
    except json.JSONDecodeError as exc:
        raise _bad(
            f"{name} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}. "
            f"Fix it there or download {name} again."
        ) from exc
    if not isinstance(value, dict):
        raise _bad(f"{name} is {_json_type(value)}, expected a JSON object {what}.")
    return value


def parse_config_bytes(data: bytes, name: str = "config.json") -> dict[str, Any]:
    """The JSON object in ``data``, or DomainError naming ``name`` (and the line and column of a JSON error)."""
    return _parse_json_object(data, name, "of the model's settings")


def parse_index_bytes(data: bytes, name: str = INDEX_NAME) -> dict[str, Any]:
    """The safetensors index in ``data``, its ``metadata.total_size`` and ``weight_map`` checked.

    Raises DomainError naming ``name`` when it is not JSON, not an object, or
    those two fields are malformed.
    """
    index = _parse_json_object(data, name, "with metadata and weight_map")
    _index_total_size(index, name)
    _weight_map_files(index, name)
    return index


def _weight_map_files(index: dict[str, Any], name: str) -> list[str]:
    """The shard files an index names, each once, in order."""
    weight_map = index.get("weight_map")
    if weight_map is None:
        return []
    if not isinstance(weight_map, dict):
        raise _bad(f"{name}: weight_map is {_json_type(weight_map)}, expected an object from tensor to file.")
    files: list[str] = []
    for tensor, file in weight_map.items():
        # Only plain names: the shards sit beside the index, and a path could
        # point the reader anywhere on the host.
        if not isinstance(file, str) or not file or Path(file).name != file or file in (".", ".."):
            raise _bad(
                f"{name}: weight_map gives {_show(file)} for tensor {tensor!r}, expected a file name beside {name}."
            )
        if file not in files:
            files.append(file)
    return files


def read_safetensors_header(path: str | Path) -> dict[str, Any]:
    """The parsed JSON header of a local ``.safetensors`` file, its tensors' offsets checked against its size.

    Reads only the header. Raises DomainError naming the file when it is
    truncated, declares an absurd header, or its header is not valid.
    """
    path = Path(path)
    name = str(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise _bad(
                    f"{name} is {size} bytes long, too short to hold the 8-byte header length: it is truncated "
                    "or not a safetensors file. Download it again."
                )
            length = int.from_bytes(prefix, "little", signed=False)
            if length > MAX_HEADER_BYTES:
                raise _bad(
                    f"{name} declares a {length}-byte header, over the {MAX_HEADER_BYTES}-byte limit: it is not "
                    "a safetensors file or its first 8 bytes are damaged. Download it again."
                )
            if 8 + length > size:
                raise _bad(
                    f"{name} declares a {length}-byte header but only {size - 8} bytes follow: the file is "
                    "truncated. Download it again."
                )
            raw = handle.read(length)
    except OSError as exc:
        raise _bad(f"{name} cannot be read: {exc.strerror or exc}.") from exc
    header = _parse_json_object(raw, f"{name} (header)", "of tensors", limit=MAX_HEADER_BYTES)
    data_bytes = size - 8 - length
    for tensor, entry in header.items():
        if tensor == "__metadata__":
            continue
        _, end = _data_offsets(tensor, entry, name)
        if end > data_bytes:
            raise _bad(
                f"{name}: tensor {tensor!r} ends at byte {end} of the data but the file holds only {data_bytes} "
                "bytes of data: the file is truncated. Download it again."
            )
    return header


def read_checkpoint(path: str | Path) -> CheckpointShape:
    """The shape of a local checkpoint: a directory, or one ``.safetensors`` file.

    A directory gives ``config.json`` and, for the weights, either
    ``model.safetensors.index.json`` (``metadata.total_size``) or the headers
    of its safetensors files (``model.safetensors``, else every shard). Shard
    headers that are present are also read for the exact routed-expert bytes.
    A ``.safetensors`` file is read with the ``config.json`` beside it, if
    any; with none, only the weights are known. Raises DomainError
    ``bad_checkpoint`` naming the file and field that cannot be read.
    """
    path = Path(path)
    if path.is_file() and path.name == "config.json":
        path = path.parent
    if path.is_file():
        if path.suffix != ".safetensors":
            raise _bad(
                f"{path} is neither a checkpoint directory nor a .safetensors file; give one of those."
            )
        _refuse_lone_shard(path)
        directory, weight_files, index, index_name = path.parent, [path], None, INDEX_NAME
    elif path.is_dir():
        directory = path
        index_path = directory / INDEX_NAME
        index_name = str(index_path)
        index = parse_index_bytes(_read_bytes(index_path), index_name) if index_path.is_file() else None
        if index is not None:
            shard_paths = [directory / f for f in _weight_map_files(index, index_name)]
            # Shards not all downloaded: the index still gives the weights,
            # and the experts are derived from the config.
            weight_files = shard_paths if shard_paths and all(p.is_file() for p in shard_paths) else []
        else:
            weight_files = _safetensors_files(directory)
    else:
        raise _bad(
            f"{path}: no such file or directory; give a local checkpoint directory or a .safetensors file."
        )

    header = _merged_header(weight_files) if weight_files else None
    header_name = str(weight_files[0]) if len(weight_files) == 1 else f"safetensors headers in {directory}"
    config_path = directory / "config.json"
    if not config_path.is_file():
        weight_bytes = _index_total_size(index, index_name) if index is not None else None
        expert_bytes = None
        if header is not None:
            total, experts = _header_sums(header, header_name)
            weight_bytes = weight_bytes or total
            expert_bytes = experts or None
        if weight_bytes is None:
            raise _bad(
                f"{directory} holds no config.json and no safetensors weights; is it a model checkpoint?"
            )
        where = header_name if header is not None else index_name
        return CheckpointShape(
            weight_bytes=weight_bytes,
            expert_bytes=expert_bytes,
            notes=(
                f"shape unknown: no config.json beside {where}; layers, heads, KV cache and context are "
                "unknown and the checks that need them will be skipped",
            ),
        )
    config = parse_config_bytes(_read_bytes(config_path), str(config_path))
    return shape_from_config(
        config,
        index=index,
        header=header,
        source=str(config_path),
        index_source=index_name,
        header_source=header_name,
    )


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _bad(f"{path} cannot be read: {exc.strerror or exc}.") from exc


def _refuse_lone_shard(path: Path) -> None:
    match = SHARD_NAME.search(path.name)
    if match and int(match.group(2)) > 1:
        raise _bad(
            f"{path} is shard {int(match.group(1))} of {int(match.group(2))}; its size is not the model's. "
            f"Give the directory {path.parent} instead."
        )


def _safetensors_files(directory: Path) -> list[Path]:
    """The weight files of a directory with no index: model.safetensors, else every shard, checked complete."""
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(p for p in directory.glob("*.safetensors") if p.is_file())
    shards = [(p, match) for p in files if (match := SHARD_NAME.search(p.name))]
    if not shards:
        return files
    # Shards named "-00001-of-00004" are one set; anything else beside them
    # (Mistral's consolidated.safetensors) is another copy of the same weights.
    totals = {int(match.group(2)) for _, match in shards}
    numbers = {int(match.group(1)) for _, match in shards}
    if len(totals) != 1 or numbers != set(range(1, totals.pop() + 1)):
        raise _bad(
            f"{directory} holds an incomplete or mixed set of safetensors shards "
            f"({', '.join(p.name for p, _ in shards)}); download the missing shards or add {INDEX_NAME}."
        )
    return [p for p, _ in shards]


def _merged_header(files: list[Path]) -> dict[str, Any]:
    """Every file's tensors in one header, each tensor's name kept once."""
    merged: dict[str, Any] = {}
    owner: dict[str, Path] = {}
    for file in files:
        for tensor, entry in read_safetensors_header(file).items():
            if tensor == "__metadata__":
                continue
            if tensor in merged:
                raise _bad(
                    f"{file}: tensor {tensor!r} is also in {owner[tensor]}; the shards overlap. "
                    "Remove the extra copy of the weights."
                )
            merged[tensor] = entry
            owner[tensor] = file
    return merged
