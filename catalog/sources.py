"""A model's shape from where models live: a Hugging Face repo, or a GGUF file.

``shape_from_hub`` fetches only ``config.json`` and
``model.safetensors.index.json`` with ``huggingface_hub``, which honours
``HF_TOKEN``, ``HF_ENDPOINT``, its cache (``HF_HOME``/``HF_HUB_CACHE``) and
offline mode (``HF_HUB_OFFLINE=1``). ``read_gguf`` reads a GGUF file's
metadata with the ``gguf`` package (llama.cpp's own reader), never its
tensor data, and takes the file's size as the weights, as llama.cpp loads
it. Both answer a ``CheckpointShape`` or raise ``DomainError``
``bad_checkpoint`` saying what is wrong and how to fix it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from base.errors import DomainError
from catalog.checkpoint import (
    INDEX_NAME,
    AttentionKind,
    CheckpointShape,
    parse_config_bytes,
    parse_index_bytes,
    shape_from_config,
)

CODE = "bad_checkpoint"
# Hugging Face's own rule for repo ids (huggingface_hub.utils.validate_repo_id): one optional namespace.
REPO_ID = re.compile(r"^(?:[\w.\-]{1,96}/)?[\w.\-]{1,96}$")
# KV cache values llama.cpp keeps per type (bytes a value); f16 unless -ctk/-ctv say otherwise.
KV_CACHE_BYTES = 2


def looks_like_repo_id(text: str) -> bool:
    """A repo id ("org/name"), not a path: no leading "/" or ".", one slash at most, nothing on disk."""
    return (
        bool(REPO_ID.match(text))
        and "/" in text
        and not text.startswith((".", "/"))
        and ".." not in text
        and not Path(text).exists()
    )


def shape_from_hub(repo_id: str, *, revision: str | None = None) -> CheckpointShape:
    """The shape of a Hugging Face model repo from its config.json and safetensors index."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if not looks_like_repo_id(repo_id):
        raise DomainError(
            CODE,
            f"{repo_id!r} is not a Hugging Face repo id: give it as org/name, e.g. meta-llama/Llama-3.1-8B.",
        )

    def fetch(filename: str, *, required: bool) -> bytes | None:
        try:
            path = hf_hub_download(repo_id, filename, revision=revision)
        except LocalEntryNotFoundError:  # before EntryNotFoundError, of which it is a kind
            if not required:
                return None
            raise DomainError(
                CODE,
                f"{repo_id}'s {filename} is not in the Hugging Face cache and the Hub cannot be reached "
                "(HF_HUB_OFFLINE, or no network): download it once, or point HF_ENDPOINT at a mirror.",
            ) from None
        except EntryNotFoundError:
            if required:
                raise DomainError(CODE, f"{repo_id} has no {filename}; is it a model repository?") from None
            return None
        except GatedRepoError:
            raise DomainError(
                CODE,
                f"{repo_id} is gated: accept its licence on the Hub and set HF_TOKEN to a token that may read it.",
            ) from None
        except RepositoryNotFoundError:
            raise DomainError(
                CODE,
                f"{repo_id} is not on the Hub (or is private): check the name, or set HF_TOKEN for a private repo.",
            ) from None
        except RevisionNotFoundError:
            raise DomainError(CODE, f"{repo_id} has no revision {revision!r}.") from None
        except HfHubHTTPError as exc:
            raise DomainError(
                CODE, f"The Hub refused {repo_id}/{filename}: {exc}.".replace("..", ".")
            ) from None
        return Path(path).read_bytes()

    config_bytes = fetch("config.json", required=True)
    assert config_bytes is not None
    config = parse_config_bytes(config_bytes, f"{repo_id}/config.json")
    index_bytes = fetch(INDEX_NAME, required=False)
    index = parse_index_bytes(index_bytes, f"{repo_id}/{INDEX_NAME}") if index_bytes is not None else None
    shape = shape_from_config(
        config, index=index, source=f"{repo_id}/config.json", index_source=f"{repo_id}/{INDEX_NAME}"
    )
    if index is None:
        shape = _with_note(
            shape,
            f"{repo_id} has no {INDEX_NAME} (a single-file checkpoint): its weights are unknown until "
            "imported from a local copy, and the memory check is skipped",
        )
    return shape


def _with_note(shape: CheckpointShape, note: str) -> CheckpointShape:
    from dataclasses import replace

    return replace(shape, notes=(*shape.notes, note))


# -- GGUF ------------------------------------------------------------------------------------------


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


def read_gguf(path: str | Path) -> CheckpointShape:
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
    return CheckpointShape(
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


def describe(shape: CheckpointShape) -> str:
    return json.dumps(shape.as_fields(), sort_keys=True)
