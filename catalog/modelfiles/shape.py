"""What reading a model's files answers, ``ModelFilesShape``, and how a refusal is worded.

Units: ``weight_bytes`` and ``expert_bytes`` are bytes *in the model's files*;
``kv_bytes_per_token`` is the KV cache of the whole model for one token, as if
every layer kept every token (the sliding-window layers that keep fewer are
described by ``sliding_window`` and ``sliding_layers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from base.errors import DomainError
from planning.types import SHAPE_FIELDS

AttentionKind = Literal["mha", "gqa", "mqa", "mla"]

# The code every refusal of a model's files carries, as the API and the admin have always answered it.
CODE = "bad_checkpoint"


@dataclass(frozen=True)
class ModelFilesShape:
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
    experts_per_token: int | None = None
    context_length: int | None = None
    notes: tuple[str, ...] = ()

    def as_fields(self) -> dict[str, Any]:
        """The shape and the context length, by the model's field names."""
        return {name: getattr(self, name) for name in (*SHAPE_FIELDS, "context_length")}


def bad(message: str) -> DomainError:
    """The refusal of a model's file, ``message`` naming the file and what is wrong with it."""
    return DomainError(CODE, message)


def show(value: Any) -> str:
    """``value`` as a message quotes it, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def json_type(value: Any) -> str:
    """What kind of JSON value ``value`` is, in words ("a list", "an object")."""
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
