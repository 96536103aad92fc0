"""The model-shape reader: real Hugging Face configs, real safetensors files, and every refusal.

Expected values are worked out by hand from each config's numbers, written
as the arithmetic so a reader can check them against the config.
"""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from base.errors import DomainError
from catalog.modelfiles import (
    MAX_HEADER_BYTES,
    ModelFilesShape,
    parse_config_bytes,
    parse_index_bytes,
    read_model_files,
    read_safetensors_header,
    shape_from_config,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf-configs"

SHAPE_FIELDS = {
    "layers",
    "attention_heads",
    "kv_heads",
    "head_dim",
    "dtype",
    "attention",
    "kv_bytes_per_token",
    "weight_bytes",
    "expert_bytes",
    "sliding_window",
    "sliding_layers",
    "context_length",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "replicated_bytes",
    "expert_intermediate_size",
    "expert_format",
}


def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def index(total_size: Any) -> dict[str, Any]:
    """A safetensors index as the Hub writes it, reduced to what the reader uses."""
    return {"metadata": {"total_size": total_size}, "weight_map": {}}


def write_safetensors(path: Path, tensors: dict[str, int], *, metadata: dict[str, str] | None = None) -> Path:
    """A real safetensors file: 8-byte little-endian header length, the JSON header, then the data.

    ``tensors`` maps a name to its size in bytes; each is stored as U8 of that length.
    """
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, size in tensors.items():
        header[name] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes with spaces
    path.write_bytes(
        struct.pack("<Q", len(raw)) + raw + bytes(range(256)) * (offset // 256) + bytes(offset % 256)
    )
    return path


def refusal(excinfo: pytest.ExceptionInfo[DomainError]) -> str:
    assert excinfo.value.code == "bad_checkpoint"
    assert excinfo.value.status == 400
    return excinfo.value.message


# ---- Real configs ----------------------------------------------------------

REAL = [
    pytest.param(
        "meta-llama__Llama-3.1-8B-Instruct",
        16060522496,
        {
            "layers": 32,
            "attention_heads": 32,
            "kv_heads": 8,
            "head_dim": 4096 // 32,
            "dtype": "bfloat16",
            "attention": "gqa",
            "kv_bytes_per_token": 2 * 32 * 8 * 128 * 2,
            "weight_bytes": 16060522496,
            "expert_bytes": None,
            "sliding_window": None,
            "sliding_layers": 0,
            "context_length": 131072,
        },
        id="llama-3.1-8b-gqa",
    ),
    pytest.param(
        "microsoft__Phi-3-mini-4k-instruct",
        7642159104,
        {
            "layers": 32,
            "attention_heads": 32,
            "kv_heads": 32,
            "head_dim": 3072 // 32,
            "dtype": "bfloat16",
            "attention": "mha",
            "kv_bytes_per_token": 2 * 32 * 32 * 96 * 2,
            "weight_bytes": 7642159104,
            # A window and no layer_types: every layer slides.
            "expert_bytes": None,
            "sliding_window": 2047,
            "sliding_layers": 32,
            "context_length": 4096,
        },
        id="phi-3-mini-mha",
    ),
    pytest.param(
        "deepseek-ai__DeepSeek-V3",
        None,
        {
            "layers": 61,
            "attention_heads": 128,
            "kv_heads": 128,
            "head_dim": 128 + 64,
            "dtype": "bfloat16",
            "attention": "mla",
            "kv_bytes_per_token": 61 * (512 + 64) * 2,
            "weight_bytes": None,
            # 256 routed experts in the 61 - 3 layers after the first_k_dense_replace dense ones, FP8: 1 byte.
            "expert_bytes": 256 * (61 - 3) * 3 * 7168 * 2048 * 1,
            "sliding_window": None,
            "sliding_layers": 0,
            "context_length": 163840,
        },
        id="deepseek-v3-mla",
    ),
    pytest.param(
        "deepseek-ai__DeepSeek-V2-Lite",
        31412968448,
        {
            "layers": 27,
            "attention_heads": 16,
            "kv_heads": 16,
            "head_dim": 128 + 64,
            "dtype": "bfloat16",
            "attention": "mla",
            "kv_bytes_per_token": 27 * (512 + 64) * 2,
            "weight_bytes": 31412968448,
            "expert_bytes": 64 * (27 - 1) * 3 * 2048 * 1408 * 2,
            "sliding_window": None,
            "sliding_layers": 0,
            "context_length": 163840,
        },
        id="deepseek-v2-lite-mla",
    ),
    pytest.param(
        "openai__gpt-oss-20b",
        13761264768,
        {
            "layers": 24,
            "attention_heads": 64,
            "kv_heads": 8,
            "head_dim": 64,
            "dtype": None,
            "attention": "gqa",
            "kv_bytes_per_token": 2 * 24 * 8 * 64 * 2,
            "weight_bytes": 13761264768,
            # MXFP4: 4-bit values plus one 8-bit scale per 32 = 17 bytes per 32 weights.
            "expert_bytes": 32 * 24 * 3 * 2880 * 2880 * 17 // 32,
            "sliding_window": 128,
            "sliding_layers": 24 // 2,
            "context_length": 131072,
        },
        id="gpt-oss-20b-sliding-layer-types",
    ),
    pytest.param(
        "google__gemma-3-27b-it",
        None,
        {
            "layers": 62,
            "attention_heads": 32,
            "kv_heads": 16,
            "head_dim": 128,
            "dtype": "bfloat16",
            "attention": "gqa",
            "kv_bytes_per_token": 2 * 62 * 16 * 128 * 2,
            "weight_bytes": None,
            # Every 6th layer global (the default sliding_window_pattern), the rest keep 1024 tokens;
            # the context is the default max_position_embeddings.
            "expert_bytes": None,
            "sliding_window": 1024,
            "sliding_layers": 62 - 62 // 6,
            "context_length": 131072,
        },
        id="gemma-3-27b-text-config-defaults",
    ),
    pytest.param(
        "Qwen__Qwen2.5-7B",
        15231233024,
        {
            "layers": 28,
            "attention_heads": 28,
            "kv_heads": 4,
            "head_dim": 3584 // 28,
            "dtype": "bfloat16",
            "attention": "gqa",
            "kv_bytes_per_token": 2 * 28 * 4 * 128 * 2,
            "weight_bytes": 15231233024,
            # sliding_window 131072 is in the config but use_sliding_window is false.
            "expert_bytes": None,
            "sliding_window": None,
            "sliding_layers": 0,
            "context_length": 131072,
        },
        id="qwen2.5-7b",
    ),
    pytest.param(
        "mistralai__Mixtral-8x7B-v0.1",
        93405585408,
        {
            "layers": 32,
            "attention_heads": 32,
            "kv_heads": 8,
            "head_dim": 4096 // 32,
            "dtype": "bfloat16",
            "attention": "gqa",
            "kv_bytes_per_token": 2 * 32 * 8 * 128 * 2,
            "weight_bytes": 93405585408,
            "expert_bytes": 8 * 32 * 3 * 4096 * 14336 * 2,
            "sliding_window": None,
            "sliding_layers": 0,
            "context_length": 32768,
        },
        id="mixtral-8x7b-moe",
    ),
    pytest.param(
        "Qwen__Qwen3-30B-A3B",
        61064245248,
        {
            # head_dim is given (128), not hidden_size / heads (2048 // 32 = 64).
            "layers": 48,
            "attention_heads": 32,
            "kv_heads": 4,
            "head_dim": 128,
            "dtype": "bfloat16",
            "attention": "gqa",
            "kv_bytes_per_token": 2 * 48 * 4 * 128 * 2,
            "weight_bytes": 61064245248,
            "expert_bytes": 128 * 48 * 3 * 2048 * 768 * 2,
            "sliding_window": None,
            "sliding_layers": 0,
            "context_length": 40960,
        },
        id="qwen3-30b-a3b-moe",
    ),
    pytest.param(
        "mistralai__Mistral-7B-Instruct-v0.3",
        14496047104,
        {
            "layers": 32,
            "attention_heads": 32,
            "kv_heads": 8,
            "head_dim": 4096 // 32,
            "dtype": "bfloat16",
            "attention": "gqa",
            "kv_bytes_per_token": 2 * 32 * 8 * 128 * 2,
            "weight_bytes": 14496047104,
            "expert_bytes": None,
            "sliding_window": None,
            "sliding_layers": 0,
            "context_length": 32768,
        },
        id="mistral-7b-v0.3-null-window",
    ),
]


# The sizes of the engine's activation peak and the replicated weights, read
# beside the shape; their own test follows.
ACTIVATION_FIELDS = {
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "replicated_bytes",
    "expert_intermediate_size",
    "expert_format",
}


@pytest.mark.parametrize(
    ("fixture", "width", "storage"),
    [
        ("meta-llama__Llama-3.1-8B-Instruct", None, None),  # dense
        ("Qwen__Qwen3-30B-A3B", 768, None),  # moe_intermediate_size, experts in bf16
        ("openai__gpt-oss-20b", 2880, "mxfp4"),  # intermediate_size; quantization_config mxfp4
        ("mistralai__Mixtral-8x7B-v0.1", 14336, None),
    ],
)
def test_the_routed_experts_width_and_storage(fixture, width, storage):
    shape = shape_from_config(load(fixture))
    assert (shape.expert_intermediate_size, shape.expert_format) == (width, storage)


@pytest.mark.parametrize(
    ("fixture", "hidden", "intermediate", "vocab", "replicated"),
    [
        ("meta-llama__Llama-3.1-8B-Instruct", 4096, 14336, 128256, 0),
        # 8 of 128 experts a token, 768 wide: 6144; router gates 48 x 2048 x 128 x 2 bytes
        ("Qwen__Qwen3-30B-A3B", 2048, 8 * 768, 151936, 48 * 2048 * 128 * 2),
        # the dense layer (10944) is wider than 6 experts x 1408; gates on 26 MoE layers x 2048 x 64,
        # MLA's kv_a_proj_with_mqa 27 x 2048 x (512 + 64), all at 2 bytes
        ("deepseek-ai__DeepSeek-V2-Lite", 2048, 10944, 102400, (26 * 2048 * 64 + 27 * 2048 * 576) * 2),
        # 2 of 8 experts x 14336
        ("mistralai__Mixtral-8x7B-v0.1", 4096, 2 * 14336, 32000, 32 * 4096 * 8 * 2),
    ],
)
def test_the_activation_sizes_and_replicated_weights(fixture, hidden, intermediate, vocab, replicated):
    shape = shape_from_config(load(fixture))
    assert (shape.hidden_size, shape.intermediate_size, shape.vocab_size) == (hidden, intermediate, vocab)
    assert shape.replicated_bytes == replicated


@pytest.mark.parametrize(("fixture", "total_size", "expected"), REAL)
def test_real_config_gives_the_hand_worked_shape(
    fixture: str, total_size: int | None, expected: dict
) -> None:
    shape = shape_from_config(load(fixture), index=index(total_size) if total_size else None)

    fields = shape.as_fields()
    assert {k: v for k, v in fields.items() if k not in ACTIVATION_FIELDS} == expected
    assert set(fields) - set(expected) == ACTIVATION_FIELDS


def test_as_fields_names_every_model_field_but_notes() -> None:
    shape = shape_from_config(load("meta-llama__Llama-3.1-8B-Instruct"))

    assert set(shape.as_fields()) == SHAPE_FIELDS
    assert "notes" not in shape.as_fields()


def test_a_shape_is_frozen() -> None:
    shape = ModelFilesShape(layers=32)

    with pytest.raises(AttributeError):
        shape.layers = 4  # type: ignore[misc]  # the assignment a frozen shape refuses


def test_derived_expert_bytes_say_so_and_dense_models_have_none() -> None:
    mixtral = shape_from_config(load("mistralai__Mixtral-8x7B-v0.1"))
    llama = shape_from_config(load("meta-llama__Llama-3.1-8B-Instruct"))

    assert [n for n in mixtral.notes if n.startswith("expert bytes derived from config")]
    assert llama.expert_bytes is None
    assert not [n for n in llama.notes if "expert" in n]


def test_weights_unknown_without_index_or_header_is_noted_once() -> None:
    shape = shape_from_config(load("meta-llama__Llama-3.1-8B-Instruct"))

    assert shape.weight_bytes is None
    assert [
        n
        for n in shape.notes
        if n.startswith("weight bytes unknown: no safetensors index or header was given")
    ]
    assert len(shape.notes) == len(set(shape.notes))


def test_gpt_oss_without_a_dtype_notes_it_and_still_sizes_the_kv_cache() -> None:
    shape = shape_from_config(load("openai__gpt-oss-20b"))

    assert shape.dtype is None
    assert any(n.startswith("dtype unknown") for n in shape.notes)
    assert shape.kv_bytes_per_token == 2 * 24 * 8 * 64 * 2


def test_qwen3_moe_skips_mlp_only_layers_and_honours_the_sparse_step() -> None:
    config = load("Qwen__Qwen3-30B-A3B")
    config["mlp_only_layers"] = [0, 1]
    config["decoder_sparse_step"] = 2  # layers 1, 3, 5, ... (counting from 0) are MoE: 24, less layer 1

    assert shape_from_config(config).expert_bytes == 128 * (24 - 1) * 3 * 2048 * 768 * 2


# ---- Multimodal text_config and model-type defaults ------------------------


def test_gemma3_notes_the_defaults_it_used() -> None:
    shape = shape_from_config(load("google__gemma-3-27b-it"))

    (note,) = [n for n in shape.notes if "gemma3_text defaults" in n]
    assert "sliding_window_pattern 6" in note
    assert "max_position_embeddings 131072" in note


def test_text_config_wins_over_the_top_level_which_fills_what_it_leaves_out() -> None:
    config = load("google__gemma-3-27b-it")
    config["num_hidden_layers"] = 99  # the top level is the fallback, not the source
    config["torch_dtype"] = "float16"

    shape = shape_from_config(config)

    assert shape.layers == 62
    assert shape.dtype == "float16"


def test_gemma3_head_dim_left_out_is_the_type_default_not_hidden_over_heads() -> None:
    config = load("google__gemma-3-27b-it")
    del config["text_config"]["head_dim"]
    del config["text_config"]["num_key_value_heads"]

    shape = shape_from_config(config)

    assert shape.head_dim == 256  # not 5376 // 32 = 168
    assert shape.kv_heads == 4
    assert shape.kv_bytes_per_token == 2 * 62 * 4 * 256 * 2


def test_gemma3_sliding_window_left_out_is_4096_and_an_explicit_pattern_counts() -> None:
    config = load("google__gemma-3-27b-it")
    del config["text_config"]["sliding_window"]
    config["text_config"]["sliding_window_pattern"] = 2

    shape = shape_from_config(config)

    assert (shape.sliding_window, shape.sliding_layers) == (4096, 62 - 62 // 2)


def test_gemma3_text_config_without_its_model_type_still_takes_the_gemma3_text_defaults() -> None:
    config = load("google__gemma-3-27b-it")
    del config["text_config"]["model_type"]  # only the top level says "gemma3"

    shape = shape_from_config(config)

    assert (shape.sliding_layers, shape.context_length) == (62 - 62 // 6, 131072)


def test_defaults_belong_to_the_model_type_only() -> None:
    config = load("google__gemma-3-27b-it")
    config["text_config"]["model_type"] = "some_other_text"

    shape = shape_from_config(config)

    # No pattern known: the window applies to every layer, and the context is unknown.
    assert (shape.sliding_layers, shape.context_length) == (62, None)


# ---- Sliding windows -------------------------------------------------------


def test_old_mistral_window_slides_every_layer() -> None:
    config = load("mistralai__Mistral-7B-Instruct-v0.3")
    config["sliding_window"] = 4096

    shape = shape_from_config(config)

    assert (shape.sliding_window, shape.sliding_layers) == (4096, 32)
    assert shape.attention == "gqa"  # the kind stays the head layout


def test_qwen2_window_used_only_from_max_window_layers_up() -> None:
    config = load("Qwen__Qwen2.5-7B")
    config["use_sliding_window"] = True
    config["max_window_layers"] = 21

    shape = shape_from_config(config)

    assert (shape.sliding_window, shape.sliding_layers) == (131072, 28 - 21)


def test_layer_types_without_a_window_count_as_full_attention() -> None:
    config = load("openai__gpt-oss-20b")
    config["sliding_window"] = None

    shape = shape_from_config(config)

    assert (shape.sliding_window, shape.sliding_layers) == (None, 0)
    assert any("layer_types marks sliding layers" in n for n in shape.notes)


def test_layer_types_of_the_wrong_length_are_refused() -> None:
    config = load("openai__gpt-oss-20b")
    config["layer_types"] = config["layer_types"][:20]

    with pytest.raises(DomainError) as excinfo:
        shape_from_config(config)

    message = refusal(excinfo)
    assert "config.json: layer_types lists 20 layers but the model has 24" in message


# ---- Field spellings, dtype, head_dim -------------------------------------


def test_head_dim_null_is_hidden_size_over_heads() -> None:
    config = load("meta-llama__Llama-3.1-8B-Instruct")
    config["head_dim"] = None

    assert shape_from_config(config).head_dim == 4096 // 32


def test_hidden_size_not_a_multiple_of_heads_rounds_down_and_says_so() -> None:
    config = load("meta-llama__Llama-3.1-8B-Instruct")
    config["hidden_size"] = 5000

    shape = shape_from_config(config)

    assert shape.head_dim == 5000 // 32
    assert any("hidden_size 5000 is not a multiple of 32 heads" in n for n in shape.notes)


def test_head_dim_given_wins_over_hidden_size_over_heads() -> None:
    config = load("meta-llama__Llama-3.1-8B-Instruct")
    config["head_dim"] = 64

    shape = shape_from_config(config)

    assert shape.head_dim == 64
    assert shape.kv_bytes_per_token == 2 * 32 * 8 * 64 * 2


@pytest.mark.parametrize(
    ("keys", "dtype"),
    [
        pytest.param({"dtype": "float16", "torch_dtype": "bfloat16"}, "float16", id="dtype-wins"),
        pytest.param({"torch_dtype": "float16"}, "float16", id="torch_dtype-alone"),
        pytest.param({"torch_dtype": "torch.bfloat16"}, "bfloat16", id="torch-prefix"),
    ],
)
def test_dtype_is_read_from_dtype_before_torch_dtype(keys: dict, dtype: str) -> None:
    config = load("meta-llama__Llama-3.1-8B-Instruct")
    del config["torch_dtype"]
    config.update(keys)

    assert shape_from_config(config).dtype == dtype


def test_float32_checkpoint_keeps_a_16_bit_kv_cache_but_4_byte_experts() -> None:
    config = load("mistralai__Mixtral-8x7B-v0.1")
    config["torch_dtype"] = "float32"

    shape = shape_from_config(config)

    assert shape.dtype == "float32"
    assert shape.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert shape.expert_bytes == 8 * 32 * 3 * 4096 * 14336 * 4


def test_unknown_dtype_assumes_two_bytes_and_says_so() -> None:
    config = load("mistralai__Mixtral-8x7B-v0.1")
    config["torch_dtype"] = "float8_e4m3fn"

    shape = shape_from_config(config)

    assert shape.dtype == "float8_e4m3fn"
    assert shape.expert_bytes == 8 * 32 * 3 * 4096 * 14336 * 2
    assert any("dtype 'float8_e4m3fn' not known" in n for n in shape.notes)


def llama_without_kv_heads(**extra: Any) -> dict[str, Any]:
    config = load("meta-llama__Llama-3.1-8B-Instruct")
    del config["num_key_value_heads"]
    config.update(extra)
    return config


@pytest.mark.parametrize(
    ("extra", "kv_heads", "attention"),
    [
        pytest.param({"num_kv_heads": 8}, 8, "gqa", id="num_kv_heads"),
        pytest.param({"n_head_kv": 4}, 4, "gqa", id="n_head_kv"),
        pytest.param({"multi_query_group_num": 2, "multi_query_attention": True}, 2, "gqa", id="chatglm"),
        pytest.param(
            {"multi_query_group_num": 2, "multi_query_attention": False}, 32, "mha", id="chatglm-off"
        ),
        pytest.param({"multi_query": True}, 1, "mqa", id="multi_query"),
        pytest.param({"num_key_value_heads": None}, 32, "mha", id="null-is-mha"),
        pytest.param({}, 32, "mha", id="missing-is-mha"),
    ],
)
def test_kv_heads_alternative_spellings(extra: dict, kv_heads: int, attention: str) -> None:
    shape = shape_from_config(llama_without_kv_heads(**extra))

    assert (shape.kv_heads, shape.attention) == (kv_heads, attention)
    assert shape.kv_bytes_per_token == 2 * 32 * kv_heads * 128 * 2


def test_gpt2_style_spellings() -> None:
    config = {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "torch_dtype": "float32"}

    shape = shape_from_config(config)

    assert shape.as_fields() == {
        "layers": 12,
        "attention_heads": 12,
        "kv_heads": 12,
        "head_dim": 768 // 12,
        "dtype": "float32",
        "attention": "mha",
        "kv_bytes_per_token": 2 * 12 * 12 * 64 * 2,
        "weight_bytes": None,
        "expert_bytes": None,
        "sliding_window": None,
        "sliding_layers": 0,
        "context_length": 1024,
        "hidden_size": 768,  # n_embd
        "intermediate_size": None,
        "vocab_size": None,
        "replicated_bytes": 0,
        "expert_intermediate_size": None,
        "expert_format": None,
    }


def test_chatglm_spellings() -> None:
    config = {
        "num_layers": 28,
        "num_attention_heads": 32,
        "hidden_size": 4096,
        "seq_length": 131072,
        "multi_query_attention": True,
        "multi_query_group_num": 2,
        "torch_dtype": "bfloat16",
    }

    shape = shape_from_config(config)

    assert (shape.layers, shape.kv_heads, shape.context_length) == (28, 2, 131072)
    assert shape.kv_bytes_per_token == 2 * 28 * 2 * 128 * 2


# ---- Missing essentials: unknown, not an error ------------------------------


def test_missing_layers_and_heads_leave_them_unknown_and_say_which_checks_are_skipped() -> None:
    config = load("meta-llama__Llama-3.1-8B-Instruct")
    del config["num_hidden_layers"]
    del config["num_attention_heads"]
    del config["num_key_value_heads"]

    shape = shape_from_config(config)

    assert (shape.layers, shape.attention_heads, shape.kv_heads) == (None, None, None)
    assert (shape.head_dim, shape.attention, shape.kv_bytes_per_token) == (None, None, None)
    assert any(n.startswith("layers unknown") and "skipped" in n for n in shape.notes)
    assert any(n.startswith("attention heads unknown") and "skipped" in n for n in shape.notes)
    assert len(shape.notes) == len(set(shape.notes))


def test_missing_context_length_is_noted() -> None:
    config = load("meta-llama__Llama-3.1-8B-Instruct")
    del config["max_position_embeddings"]

    shape = shape_from_config(config)

    assert shape.context_length is None
    assert any(n.startswith("context length unknown") for n in shape.notes)


# ---- Refusals, each naming the file and the field ---------------------------


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        pytest.param("num_attention_heads", "abc", "'abc'", id="string-heads"),
        pytest.param("num_attention_heads", -32, "-32", id="negative-heads"),
        pytest.param("num_hidden_layers", 0, "0", id="zero-layers"),
        pytest.param("num_key_value_heads", 2.5, "2.5", id="fractional-kv-heads"),
        pytest.param("hidden_size", True, "True", id="bool-hidden"),
        pytest.param("max_position_embeddings", "131072", "'131072'", id="string-context"),
        pytest.param("head_dim", [128], "[128]", id="list-head-dim"),
    ],
)
def test_a_bad_count_is_refused_naming_file_and_field(field: str, value: Any, shown: str) -> None:
    config = load("meta-llama__Llama-3.1-8B-Instruct")
    config[field] = value

    with pytest.raises(DomainError) as excinfo:
        shape_from_config(config, source="llama/config.json")

    message = refusal(excinfo)
    assert message.startswith(f"llama/config.json: {field} is {shown}, expected a whole number")
    assert f"Correct {field} in llama/config.json" in message


def test_a_bad_count_inside_text_config_is_named_with_its_path() -> None:
    config = load("google__gemma-3-27b-it")
    config["text_config"]["num_key_value_heads"] = "sixteen"

    with pytest.raises(DomainError) as excinfo:
        shape_from_config(config)

    assert "config.json: text_config.num_key_value_heads is 'sixteen'" in refusal(excinfo)


def test_heads_that_kv_heads_do_not_divide_are_refused() -> None:
    config = load("meta-llama__Llama-3.1-8B-Instruct")
    config["num_key_value_heads"] = 5

    with pytest.raises(DomainError) as excinfo:
        shape_from_config(config)

    message = refusal(excinfo)
    assert "config.json" in message and "num_key_value_heads" in message


@pytest.mark.parametrize(
    ("field", "value"),
    [("torch_dtype", 16), ("use_sliding_window", "no"), ("text_config", [1]), ("mlp_only_layers", 3)],
)
def test_other_malformed_fields_are_refused_by_name(field: str, value: Any) -> None:
    config = load("Qwen__Qwen3-30B-A3B")
    config[field] = value

    with pytest.raises(DomainError) as excinfo:
        shape_from_config(config)

    assert f"config.json: {field} is" in refusal(excinfo)


def test_config_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(DomainError) as excinfo:
        shape_from_config([1, 2], source="x/config.json")  # type: ignore[arg-type]  # the bad input under test

    assert refusal(excinfo).startswith("x/config.json is a list")


# ---- Index and uploaded bytes -----------------------------------------------


def test_index_total_size_as_a_string_of_digits_is_accepted() -> None:
    shape = shape_from_config(load("meta-llama__Llama-3.1-8B-Instruct"), index=index("16060522496"))

    assert shape.weight_bytes == 16060522496


@pytest.mark.parametrize("total", ["16 GB", -5, 0, 1.6e10, True, [1]])
def test_bad_index_total_size_is_refused_naming_file_and_field(total: Any) -> None:
    with pytest.raises(DomainError) as excinfo:
        shape_from_config(
            load("meta-llama__Llama-3.1-8B-Instruct"), index=index(total), index_source="idx.json"
        )

    assert refusal(excinfo).startswith("idx.json: metadata.total_size is ")


def test_index_without_total_size_leaves_weights_unknown_and_says_why() -> None:
    shape = shape_from_config(load("meta-llama__Llama-3.1-8B-Instruct"), index={"weight_map": {}})

    assert shape.weight_bytes is None
    assert any("has no metadata.total_size" in n for n in shape.notes)


def test_index_wins_over_header_for_the_weights() -> None:
    header = {"model.embed_tokens.weight": {"dtype": "U8", "shape": [10], "data_offsets": [0, 10]}}

    shape = shape_from_config(
        load("meta-llama__Llama-3.1-8B-Instruct"), index=index(16060522496), header=header
    )

    assert shape.weight_bytes == 16060522496


def test_parse_config_bytes_reads_an_object() -> None:
    assert parse_config_bytes(b'\xef\xbb\xbf{"num_hidden_layers": 2}') == {"num_hidden_layers": 2}


def test_invalid_json_is_refused_with_file_line_and_column() -> None:
    with pytest.raises(DomainError) as excinfo:
        parse_config_bytes(
            b'{\n  "num_hidden_layers": 32,\n  "num_attention_heads": ,\n}', name="upload/config.json"
        )

    message = refusal(excinfo)
    assert message.startswith("upload/config.json is not valid JSON")
    assert "line 3, column 26" in message


@pytest.mark.parametrize(
    ("data", "words"),
    [(b"[1, 2]", "is a list"), (b'"text"', "is a string"), (b"\xff\xfe{}", "is not UTF-8")],
)
def test_config_bytes_that_are_not_an_object_are_refused(data: bytes, words: str) -> None:
    with pytest.raises(DomainError) as excinfo:
        parse_config_bytes(data)

    assert refusal(excinfo).startswith(f"config.json {words}")


def test_parse_index_bytes_checks_total_size() -> None:
    good = parse_index_bytes(
        b'{"metadata": {"total_size": 42}, "weight_map": {"a": "model-00001-of-00001.safetensors"}}'
    )
    assert good["metadata"]["total_size"] == 42

    with pytest.raises(DomainError) as excinfo:
        parse_index_bytes(b'{"metadata": {"total_size": "lots"}}')
    assert refusal(excinfo).startswith("model.safetensors.index.json: metadata.total_size is 'lots'")


def test_index_naming_a_shard_outside_its_directory_is_refused() -> None:
    with pytest.raises(DomainError) as excinfo:
        parse_index_bytes(b'{"metadata": {"total_size": 42}, "weight_map": {"a": "../../etc/passwd"}}')

    assert "weight_map gives '../../etc/passwd'" in refusal(excinfo)


# ---- Safetensors files ------------------------------------------------------


def test_single_safetensors_file_gives_exact_weight_and_expert_bytes(tmp_path: Path) -> None:
    file = write_safetensors(
        tmp_path / "model.safetensors",
        {"model.layers.0.mlp.experts.0.down_proj.weight": 4 * 8 * 2, "model.embed_tokens.weight": 16 * 4 * 2},
        metadata={"format": "pt"},
    )

    shape = read_model_files(file)

    assert shape.weight_bytes == 4 * 8 * 2 + 16 * 4 * 2
    assert shape.expert_bytes == 4 * 8 * 2
    assert shape.as_fields() | {"weight_bytes": None, "expert_bytes": None} == ModelFilesShape().as_fields()
    (note,) = shape.notes
    assert note.startswith("shape unknown: no config.json beside")


def test_header_expert_bytes_are_exact_and_leave_out_shared_experts(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(load("mistralai__Mixtral-8x7B-v0.1")))
    write_safetensors(
        tmp_path / "model.safetensors",
        {
            "model.layers.0.block_sparse_moe.experts.0.w1.weight": 96,
            "model.layers.0.block_sparse_moe.experts.1.w1.weight": 32,
            "model.layers.0.mlp.shared_experts.gate_proj.weight": 64,
            "model.layers.0.mlp.shared_expert.up_proj.weight": 8,
            "model.layers.0.mlp.experts.shared_expert.down_proj.weight": 4,
            "model.norm.weight": 16,
        },
    )

    shape = read_model_files(tmp_path)

    assert shape.weight_bytes == 96 + 32 + 64 + 8 + 4 + 16
    assert shape.expert_bytes == 96 + 32
    assert shape.layers == 32
    assert not any("expert bytes derived" in n for n in shape.notes)


def test_directory_with_config_and_index(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(load("meta-llama__Llama-3.1-8B-Instruct")))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps(
            {"metadata": {"total_size": 16060522496}, "weight_map": {"a": "model-00001-of-00004.safetensors"}}
        )
    )

    shape = read_model_files(tmp_path)

    assert shape.weight_bytes == 16060522496
    assert shape.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert not any(n.startswith("weight bytes unknown") for n in shape.notes)


def test_index_with_its_shards_present_reads_their_headers_for_the_experts(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(load("Qwen__Qwen3-30B-A3B")))
    write_safetensors(
        tmp_path / "model-00001-of-00002.safetensors", {"model.layers.0.mlp.experts.0.up_proj.weight": 40}
    )
    write_safetensors(
        tmp_path / "model-00002-of-00002.safetensors", {"model.layers.1.mlp.experts.3.up_proj.weight": 24}
    )
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "metadata": {"total_size": 61064245248},
                "weight_map": {
                    "model.layers.0.mlp.experts.0.up_proj.weight": "model-00001-of-00002.safetensors",
                    "model.layers.1.mlp.experts.3.up_proj.weight": "model-00002-of-00002.safetensors",
                },
            }
        )
    )

    shape = read_model_files(tmp_path)

    assert shape.weight_bytes == 61064245248
    assert shape.expert_bytes == 40 + 24


def test_sharded_safetensors_without_index_sum_every_header(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(load("meta-llama__Llama-3.1-8B-Instruct")))
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": 100, "b": 28})
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"c": 72})
    # Another copy of the same weights in the original format, as Mistral's repositories carry.
    write_safetensors(tmp_path / "consolidated.safetensors", {"a": 100, "b": 28, "c": 72})

    assert read_model_files(tmp_path).weight_bytes == 100 + 28 + 72


def test_sharded_safetensors_with_a_shard_missing_are_refused(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "model-00001-of-00003.safetensors", {"a": 8})
    write_safetensors(tmp_path / "model-00003-of-00003.safetensors", {"c": 8})

    with pytest.raises(DomainError) as excinfo:
        read_model_files(tmp_path)

    assert "incomplete or mixed set of safetensors shards" in refusal(excinfo)


def test_one_shard_alone_is_refused(tmp_path: Path) -> None:
    file = write_safetensors(tmp_path / "model-00002-of-00004.safetensors", {"a": 8})

    with pytest.raises(DomainError) as excinfo:
        read_model_files(file)

    assert "is shard 2 of 4" in refusal(excinfo)


def test_truncated_header_is_refused_naming_the_file(tmp_path: Path) -> None:
    file = write_safetensors(tmp_path / "model.safetensors", {"a": 8})
    file.write_bytes(file.read_bytes()[:20])

    with pytest.raises(DomainError) as excinfo:
        read_model_files(file)

    message = refusal(excinfo)
    assert message.startswith(str(file)) and "truncated" in message


def test_truncated_data_is_refused_naming_the_file_and_tensor(tmp_path: Path) -> None:
    file = write_safetensors(tmp_path / "model.safetensors", {"first": 8, "last": 1000})
    file.write_bytes(file.read_bytes()[:-10])

    with pytest.raises(DomainError) as excinfo:
        read_model_files(file)

    message = refusal(excinfo)
    assert message.startswith(f"{file}: tensor 'last' ends at byte 1008")
    assert "truncated" in message


def test_file_shorter_than_the_length_prefix_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"\x10\x00\x00")

    with pytest.raises(DomainError) as excinfo:
        read_safetensors_header(file)

    assert "too short to hold the 8-byte header length" in refusal(excinfo)


def test_absurd_header_length_is_refused_before_reading_it(tmp_path: Path) -> None:
    file = tmp_path / "model.safetensors"
    file.write_bytes(struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}")
    # Long enough to hold the declared header (sparse, so it costs no disk):
    # only the limit can refuse it.
    with file.open("r+b") as handle:
        handle.truncate(8 + MAX_HEADER_BYTES + 16)

    with pytest.raises(DomainError) as excinfo:
        read_model_files(file)

    message = refusal(excinfo)
    assert message.startswith(f"{file} declares a {MAX_HEADER_BYTES + 1}-byte header, over the")
    assert f"{MAX_HEADER_BYTES}-byte limit" in message


def test_header_that_is_not_json_is_refused_with_line_and_column(tmp_path: Path) -> None:
    file = tmp_path / "model.safetensors"
    raw = b'{"a": {"data_offsets": [0, 8}}  '
    file.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(8))

    with pytest.raises(DomainError) as excinfo:
        read_model_files(file)

    message = refusal(excinfo)
    assert message.startswith(f"{file} (header) is not valid JSON") and "line 1, column" in message


def test_header_with_bad_offsets_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    file = tmp_path / "model.safetensors"
    raw = json.dumps({"w": {"dtype": "U8", "shape": [8], "data_offsets": [8, 0]}}).encode()
    file.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(8))

    with pytest.raises(DomainError) as excinfo:
        read_model_files(file)

    assert refusal(excinfo).startswith(f"{file}: tensor 'w' has data_offsets [8, 0]")


def test_bad_config_in_a_directory_names_its_path(tmp_path: Path) -> None:
    config = load("meta-llama__Llama-3.1-8B-Instruct")
    config["num_attention_heads"] = "abc"
    (tmp_path / "config.json").write_text(json.dumps(config))

    with pytest.raises(DomainError) as excinfo:
        read_model_files(tmp_path)

    assert refusal(excinfo).startswith(f"{tmp_path / 'config.json'}: num_attention_heads is 'abc'")


@pytest.mark.parametrize("name", ["missing", "empty", "notes.txt"])
def test_a_path_that_is_not_a_checkpoint_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hello")

    with pytest.raises(DomainError):
        read_model_files(tmp_path / name)


# ---- Properties --------------------------------------------------------------


@given(
    layers=st.integers(1, 200),
    kv_heads=st.integers(1, 64),
    group=st.integers(1, 16),
    head_dim=st.sampled_from([64, 80, 96, 128, 256]),
)
def test_kv_bytes_and_attention_kind_follow_the_head_layout(
    layers: int, kv_heads: int, group: int, head_dim: int
) -> None:
    config = {
        "num_hidden_layers": layers,
        "num_attention_heads": kv_heads * group,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "torch_dtype": "bfloat16",
    }

    shape = shape_from_config(config)

    assert shape.kv_bytes_per_token == 2 * layers * kv_heads * head_dim * 2
    expected = "mqa" if kv_heads == 1 else "mha" if group == 1 else "gqa"
    assert shape.attention == expected


@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=6),
    expert_mask=st.lists(st.booleans(), min_size=6),
)
def test_header_sums_are_exact_for_any_tensor_sizes(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], expert_mask: list[bool]
) -> None:
    names = [
        f"model.layers.{i}.mlp.experts.0.w" if expert_mask[i] else f"model.layers.{i}.w"
        for i in range(len(sizes))
    ]
    file = write_safetensors(
        tmp_path_factory.mktemp("st") / "model.safetensors", dict(zip(names, sizes, strict=True))
    )

    shape = read_model_files(file)

    assert shape.weight_bytes == sum(sizes)
    assert shape.expert_bytes == (sum(s for s, e in zip(sizes, expert_mask, strict=False) if e) or None)


def test_reading_never_changes_the_config() -> None:
    config = load("google__gemma-3-27b-it")
    before = copy.deepcopy(config)

    shape_from_config(config)

    assert config == before
