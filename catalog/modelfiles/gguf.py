"""A model's shape from a GGUF file: its metadata read with the ``gguf`` package
(llama.cpp's own reader), never its tensor data, and the file's size as the
weights, as llama.cpp loads it. A file that cannot be read is refused with a
``DomainError`` saying what is wrong and how to fix it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from base.errors import DomainError
from catalog.modelfiles.shape import CODE, AttentionKind, ModelFilesShape

# KV cache values llama.cpp keeps per type (bytes a value); f16 unless -ctk/-ctv say otherwise.
KV_CACHE_BYTES = 2


def _field(reader: Any, key: str) -> Any:
    """A GGUF metadata value: a scalar, a string, or a list; None when absent."""
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _count(reader: Any, key: str, name: str) -> int | None:
    value = _field(reader, key)
    if value is None:
        return None
    if isinstance(value, list):  # per-layer head counts (some architectures): the largest
        value = max(value) if value else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise DomainError(
            CODE, f"{name}: {key} is {value!r}, expected a whole number above zero. The file is damaged."
        )
    return value


def read_gguf(path: str | Path) -> ModelFilesShape:
    """The shape a GGUF file's metadata describes, its size as the weights."""
    import gguf

    path = Path(path)
    name = str(path)
    try:
        size = path.stat().st_size
        reader = gguf.GGUFReader(path)
    except FileNotFoundError:
        raise DomainError(
            CODE, f"{name}: no such file; give the path of a .gguf file on this host."
        ) from None
    except (ValueError, OSError) as exc:
        raise DomainError(
            CODE, f"{name} is not a GGUF file llama.cpp can read ({exc}); download it again or convert it."
        ) from None
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str) or not arch:
        raise DomainError(CODE, f"{name} has no general.architecture: it is not a model GGUF.")
    layers = _count(reader, f"{arch}.block_count", name)
    heads = _count(reader, f"{arch}.attention.head_count", name)
    kv_heads = _count(reader, f"{arch}.attention.head_count_kv", name) or heads
    hidden = _count(reader, f"{arch}.embedding_length", name)
    ffn = _count(reader, f"{arch}.feed_forward_length", name)
    context = _count(reader, f"{arch}.context_length", name)
    head_dim = _count(reader, f"{arch}.attention.key_length", name) or (
        hidden // heads if hidden and heads else None
    )
    value_dim = _count(reader, f"{arch}.attention.value_length", name) or head_dim
    window = _count(reader, f"{arch}.attention.sliding_window", name)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = len(tokens.data) if tokens is not None else None
    file_type = _field(reader, "general.file_type")
    try:
        quant = gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_") if file_type is not None else None
    except ValueError:
        quant = f"file type {file_type}"
    notes = [f"weights: the GGUF file's size ({size} bytes), as llama.cpp loads it"]
    kv_bytes = None
    if layers and kv_heads and head_dim and value_dim:
        kv_bytes = layers * kv_heads * (head_dim + value_dim) * KV_CACHE_BYTES
    else:
        notes.append("KV cache per token unknown: the file lacks block_count, head counts or key length")
    attention: AttentionKind | None = None
    if kv_heads and heads:
        attention = "mqa" if kv_heads == 1 else "mha" if kv_heads == heads else "gqa"
    sliding_layers = layers if window and layers else 0
    if window:
        notes.append(f"sliding window {window}: every layer counted as sliding (the file does not say which)")
    return ModelFilesShape(
        layers=layers,
        attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=(quant or "")[:32] or None,
        attention=attention,
        kv_bytes_per_token=kv_bytes,
        weight_bytes=size,
        sliding_window=window,
        sliding_layers=sliding_layers,
        context_length=context,
        hidden_size=hidden,
        intermediate_size=ffn,
        vocab_size=vocab,
        notes=tuple(notes),
    )
