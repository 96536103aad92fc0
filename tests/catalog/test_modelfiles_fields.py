"""How config.json is read: a multimodal model's text_config and the model type's defaults, sliding
windows, the spellings of each field (dtype, head_dim, the KV heads), and what is left unknown."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from base.errors import DomainError
from catalog.modelfiles import shape_from_config
from tests.catalog.modelfiles_support import load, refusal

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
        "experts_per_token": None,
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
