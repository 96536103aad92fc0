"""The model-shape reader on real Hugging Face configs: the shape worked out by hand for each, the
activation sizes and the routed experts beside it, and the notes it leaves.

Expected values are worked out by hand from each config's numbers, written
as the arithmetic so a reader can check them against the config.
"""

from __future__ import annotations

import copy

import pytest

from catalog.modelfiles import ModelFilesShape, shape_from_config
from tests.catalog.modelfiles_support import index, load

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
    "experts_per_token",
}


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
    "experts_per_token",
}


@pytest.mark.parametrize(
    ("fixture", "width", "storage", "active"),
    [
        ("meta-llama__Llama-3.1-8B-Instruct", None, None, None),  # dense
        ("Qwen__Qwen3-30B-A3B", 768, None, 8),  # moe_intermediate_size, experts in bf16, num_experts_per_tok
        ("openai__gpt-oss-20b", 2880, "mxfp4", 4),  # intermediate_size; quantization_config mxfp4
        ("mistralai__Mixtral-8x7B-v0.1", 14336, None, 2),
    ],
)
def test_the_routed_experts_width_and_storage(fixture, width, storage, active):
    shape = shape_from_config(load(fixture))
    assert (shape.expert_intermediate_size, shape.expert_format) == (width, storage)
    assert shape.experts_per_token == active


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


def test_reading_never_changes_the_config() -> None:
    config = load("google__gemma-3-27b-it")
    before = copy.deepcopy(config)

    shape_from_config(config)

    assert config == before
