"""Hypothesis over the shape importer: whatever a config.json or a safetensors header holds, the
importer answers a shape or a DomainError (a sentence), never another exception."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import DomainError
from catalog.modelfiles import parse_config_bytes, read_safetensors_header, shape_from_config

# The keys the importer reads, so that hostile values reach the code that uses them.
KEYS = [
    "architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "torch_dtype", "sliding_window",
    "kv_lora_rank", "qk_rope_head_dim", "n_routed_experts", "num_experts", "intermediate_size",
    "vocab_size", "text_config", "quantization_config", "rope_scaling", "layer_types",
]  # fmt: skip
leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
value = st.recursive(
    leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=4),
    max_leaves=12,
)
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 131072, "torch_dtype": "bfloat16", "intermediate_size": 14336,
    "vocab_size": 128256,
}  # fmt: skip
# A real config with some of its values made hostile, and configs of hostile values only.
config = st.dictionaries(st.sampled_from(KEYS), value, max_size=5).map(
    lambda bad: {**LLAMA, **bad}
) | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), value, max_size=12)


@settings(max_examples=300)
@given(config=config)
def test_any_config_gives_a_shape_or_a_sentence(config: dict[str, Any]):
    try:
        shape_from_config(config)
    except DomainError as err:
        assert err.message


@settings(max_examples=200)
@given(raw=st.binary(max_size=200) | config.map(lambda c: json.dumps(c).encode()))
def test_any_config_file_gives_an_object_or_a_sentence(raw: bytes):
    try:
        assert isinstance(parse_config_bytes(raw), dict)
    except DomainError as err:
        assert err.message


tensor = st.fixed_dictionaries(
    {"dtype": st.sampled_from(["BF16", "F16", "F32", "I8", "F8_E4M3", "U8", "??"]) | leaf},
    optional={"shape": st.lists(st.integers(min_value=-5, max_value=2**40), max_size=4) | leaf,
              "data_offsets": st.lists(st.integers(min_value=-5, max_value=2**40), max_size=3) | leaf},
)  # fmt: skip
header = st.dictionaries(st.text(max_size=10), tensor | value, max_size=6)


@settings(max_examples=200)
@given(
    body=header.map(lambda h: json.dumps(h).encode()) | st.binary(max_size=64),
    declared=st.integers(0, 2**64 - 1) | st.none(),
)
def test_any_safetensors_header_gives_tensors_or_a_sentence(
    tmp_path_factory: Any, body: bytes, declared: int | None
):
    path = Path(tmp_path_factory.mktemp("st")) / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(body) if declared is None else declared) + body)
    try:
        read_safetensors_header(path)
    except DomainError as err:
        assert err.message
