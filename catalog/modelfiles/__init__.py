"""A model's shape, read from its files: a Hugging Face model's ``config.json``
and safetensors index or headers (on this host or on the Hub), or a GGUF file.

Pure: ``shape_from_config`` works on already-parsed JSON, ``read_model_files``
only reads local files (the safetensors headers, never the tensor data),
``shape_from_hub`` fetches only the config and the index, and ``read_gguf``
only the GGUF metadata. Each answers a ``ModelFilesShape``, which the import
command, the admin and the cluster's settings translate into the model's fields
with ``as_fields()``, or raises DomainError ``bad_checkpoint`` naming the file
and field that cannot be read. The memory and heads checks read those fields.

By concern: ``shape`` (the answer and the wording of a refusal), ``limits``
(how much is read), ``fields`` (config.json's spellings and defaults),
``config`` (config.json to a shape, with ``attention`` and ``experts``),
``safetensors`` (index and headers to weight bytes), ``local`` (a directory or
a file on this host), ``hub`` and ``gguf``.
"""

from __future__ import annotations

from catalog.modelfiles.config import parse_config_bytes, shape_from_config
from catalog.modelfiles.gguf import read_gguf
from catalog.modelfiles.hub import looks_like_repo_id, shape_from_hub
from catalog.modelfiles.limits import MAX_HEADER_BYTES, MAX_JSON_BYTES
from catalog.modelfiles.local import read_model_files
from catalog.modelfiles.safetensors import INDEX_NAME, parse_index_bytes, read_safetensors_header
from catalog.modelfiles.shape import AttentionKind, ModelFilesShape

__all__ = [
    "INDEX_NAME",
    "MAX_HEADER_BYTES",
    "MAX_JSON_BYTES",
    "AttentionKind",
    "ModelFilesShape",
    "looks_like_repo_id",
    "parse_config_bytes",
    "parse_index_bytes",
    "read_gguf",
    "read_model_files",
    "read_safetensors_header",
    "shape_from_config",
    "shape_from_hub",
]
