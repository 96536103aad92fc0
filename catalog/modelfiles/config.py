"""config.json to a shape: ``shape_from_config`` reads a parsed config, taking
the weights from a parsed safetensors index or header when given, and
``parse_config_bytes`` parses the file as uploaded or read."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from base.notes import Notes
from catalog.modelfiles.attention import (
    attention_kind,
    count_kv_heads,
    derive_head_dim,
    kv_bytes_per_token,
    mla_dims,
    sliding_window_layers,
)
from catalog.modelfiles.experts import (
    activation_sizes,
    derived_expert_bytes,
    expert_storage,
    experts_per_token,
)
from catalog.modelfiles.fields import CONTEXT_NAMES, HEAD_NAMES, HIDDEN_NAMES, LAYER_NAMES, ConfigFields
from catalog.modelfiles.limits import parse_json_object
from catalog.modelfiles.safetensors import INDEX_NAME, header_sums, index_total_size
from catalog.modelfiles.shape import ModelFilesShape, bad, json_type, show

# Bytes a weight takes in the model's files, by dtype. Spellings other than
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


def shape_from_config(
    config: dict[str, Any],
    *,
    index: dict[str, Any] | None = None,
    header: dict[str, Any] | None = None,
    source: str = "config.json",
    index_source: str = INDEX_NAME,
    header_source: str = "safetensors header",
) -> ModelFilesShape:
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
        raise bad(f"{source} is {json_type(config)}, expected a JSON object of the model's settings.")
    cfg = ConfigFields(config, source)
    notes = Notes()

    layers = cfg.count(*LAYER_NAMES)
    heads = cfg.count(*HEAD_NAMES)
    hidden = cfg.count(*HIDDEN_NAMES)
    kv_heads = count_kv_heads(cfg, heads)
    mla = mla_dims(cfg)
    head_dim = derive_head_dim(cfg, hidden, heads, mla, notes)
    dtype, weight_param_bytes = _dtype(cfg, notes)
    attention = attention_kind(kv_heads, heads, mla)

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
    kv_bytes = kv_bytes_per_token(layers, kv_heads, head_dim, mla)
    if kv_bytes is None:
        notes.add("KV cache per token unknown: the memory check will count weights and overhead only")

    sliding_window, sliding_layers = sliding_window_layers(cfg, layers, notes)
    # max_position_embeddings as written, rope_scaling notwithstanding: YaRN
    # models that ship scaled (DeepSeek-V3: 4096 x 40 = 163840, gpt-oss)
    # already say the scaled length there, and one whose rope_scaling an
    # operator adds by hand should have its context raised by hand too.
    context = cfg.count(*CONTEXT_NAMES)
    if context is None:
        notes.add(
            f"context length unknown: {source} gives none of {', '.join(CONTEXT_NAMES)}; set it by hand"
        )

    weight_bytes, expert_tensor_bytes = _weights_from_files(index, header, index_source, header_source, notes)
    expert_bytes = expert_tensor_bytes or None
    if expert_bytes is None:
        expert_bytes = derived_expert_bytes(cfg, layers, hidden, weight_param_bytes, notes)

    intermediate, replicated = activation_sizes(cfg, layers, hidden, weight_param_bytes, mla)
    expert_intermediate, expert_format = expert_storage(cfg)

    if cfg.defaults_used:
        used = ", ".join(f"{name} {value}" for name, value in cfg.defaults_used.items())
        notes.add(f"{source} leaves out fields transformers fills with {cfg.model_type} defaults: {used}")

    return ModelFilesShape(
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
        experts_per_token=experts_per_token(cfg),
        notes=notes.as_tuple(),
    )


def _weights_from_files(
    index: dict[str, Any] | None,
    header: dict[str, Any] | None,
    index_source: str,
    header_source: str,
    notes: Notes,
) -> tuple[int | None, int | None]:
    """(weight bytes, routed-expert bytes) from the index's total size or the header's tensors; None when unknown."""
    tensor_bytes, expert_tensor_bytes = (None, None) if header is None else header_sums(header, header_source)
    weight_bytes = index_total_size(index, index_source) if index is not None else None
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
    return weight_bytes, expert_tensor_bytes


def _dtype(cfg: ConfigFields, notes: Notes) -> tuple[str | None, Fraction]:
    """The weights' dtype name and bytes a weight, assuming 2 when unknown."""
    # Newer transformers write "dtype"; older ones "torch_dtype".
    found = cfg.find("dtype") or cfg.find("torch_dtype")
    if found is None:
        notes.add(
            f"dtype unknown: {cfg.source} gives neither dtype nor torch_dtype; 16-bit (2 bytes a value) assumed"
        )
        return None, Fraction(2)
    label, value = found
    if not isinstance(value, str) or not value.strip() or len(value) > 32:
        raise bad(
            f'{cfg.source}: {label} is {show(value)}, expected a dtype name such as "bfloat16". '
            f"Correct it in {cfg.source}."
        )
    name = value.strip().removeprefix("torch.")
    canonical = DTYPE_ALIASES.get(name.lower())
    if canonical is None:
        notes.add(f"dtype {name!r} not known: 2 bytes a weight assumed")
        return name, Fraction(2)
    return canonical, Fraction(DTYPE_BYTES[canonical])


def parse_config_bytes(data: bytes, name: str = "config.json") -> dict[str, Any]:
    """The JSON object in ``data``, or DomainError naming ``name`` (and the line and column of a JSON error)."""
    return parse_json_object(data, name, "of the model's settings")
