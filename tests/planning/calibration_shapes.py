"""The shapes of the calibration's models (tests/planning/calibration.py): config.json figures, read
from tests/fixtures/hf-configs where there is a copy, with the weights the log gives where the
checkpoint's size is not known here."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from catalog.modelfiles import shape_from_config
from planning.types import Shape
from tests.planning.calibration_logged import GIB

LLAMA_3_8B = Shape(  # meta-llama/Meta-Llama-3-8B and Llama-3.1-8B: same layers, total_size 16060522496
    layers=32,
    attention_heads=32,
    kv_heads=8,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=2 * 32 * 8 * 128 * 2,
    weight_bytes=16_060_522_496,
    hidden_size=4096,
    intermediate_size=14336,
    vocab_size=128256,
)
QWEN2_5_7B_AWQ = Shape(  # Qwen/Qwen2.5-7B-Instruct-AWQ: the Qwen2.5-7B config, 4-bit weights
    layers=28,
    attention_heads=28,
    kv_heads=4,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=2 * 28 * 4 * 128 * 2,
    weight_bytes=round(5.20 * GIB),
    hidden_size=3584,
    intermediate_size=18944,
    vocab_size=152064,
)
QWEN2_5_7B = Shape(  # Qwen/Qwen2.5-7B-Instruct config.json (tests/fixtures' copy); total_size 15231233024
    layers=28,
    attention_heads=28,
    kv_heads=4,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=2 * 28 * 4 * 128 * 2,
    weight_bytes=15_231_233_024,
    hidden_size=3584,
    intermediate_size=18944,
    vocab_size=152064,
)
QWEN2_5_32B = Shape(  # Qwen/Qwen2.5-32B-Instruct config.json
    layers=64,
    attention_heads=40,
    kv_heads=8,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=2 * 64 * 8 * 128 * 2,
    weight_bytes=round(30.71 * 2 * GIB),
    hidden_size=5120,
    intermediate_size=27648,
    vocab_size=152064,
)
R1_DISTILL_14B = Shape(  # deepseek-ai/DeepSeek-R1-Distill-Qwen-14B config.json (Qwen2.5-14B)
    layers=48,
    attention_heads=40,
    kv_heads=8,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=2 * 48 * 8 * 128 * 2,
    weight_bytes=round(13.9476 * 2 * GIB),
    hidden_size=5120,
    intermediate_size=13824,
    vocab_size=152064,
)
R1_DISTILL_1_5B = Shape(  # deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B config.json (Qwen2, lm_head untied)
    layers=28,
    attention_heads=12,
    kv_heads=2,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=2 * 28 * 2 * 128 * 2,
    weight_bytes=round(3.34 * GIB),
    hidden_size=1536,
    intermediate_size=8960,
    vocab_size=151936,
)

QWEN3_4B = Shape(  # Qwen/Qwen3-4B config.json (huggingface.co/Qwen/Qwen3-4B): 36 layers, 8 KV heads of 128
    layers=36,
    attention_heads=32,
    kv_heads=8,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=2 * 36 * 8 * 128 * 2,
    weight_bytes=round(7.56 * GIB),  # the log's "model weights take 7.56GiB"
    hidden_size=2560,
    intermediate_size=9728,
    vocab_size=151936,
)

QWEN3_14B = Shape(  # Qwen/Qwen3-14B config.json: 40 layers, 40 heads, 8 KV heads of 128 (huggingface.co/Qwen/Qwen3-14B)
    layers=40,
    attention_heads=40,
    kv_heads=8,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=2 * 40 * 8 * 128 * 2,
    weight_bytes=round(4 * 7.08 * GIB),  # SGLang's "Load weight end ... mem usage=7.08 GB" a card at TP 4
    hidden_size=5120,
    intermediate_size=17408,
    vocab_size=151936,
)
QWEN3_32B_AWQ = Shape(  # Qwen/Qwen3-32B config.json (the AWQ checkpoint's is the same): 64 layers, 8 KV heads
    layers=64,
    attention_heads=64,
    kv_heads=8,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=2 * 64 * 8 * 128 * 2,
    weight_bytes=round(4.58 * 4 * GIB),  # the log's 4.58 GiB a card at TP 4
    hidden_size=5120,
    intermediate_size=25600,
    vocab_size=151936,
)
R1_0528_QWEN3_8B = (
    Shape(  # deepseek-ai/DeepSeek-R1-0528-Qwen3-8B config.json (Qwen3-8B): 36 layers, 8 KV heads
        layers=36,
        attention_heads=32,
        kv_heads=8,
        head_dim=128,
        attention="gqa",
        kv_bytes_per_token=2 * 36 * 8 * 128 * 2,
        weight_bytes=round(3.85 * 4 * GIB),  # the log's 3.85 GiB a card at TP 4
        hidden_size=4096,
        intermediate_size=12288,
        vocab_size=151936,
    )
)

DEEPSEEK_R1_AWQ = Shape(  # deepseek-ai/DeepSeek-R1 config.json (tests/fixtures' copy); AWQ 4-bit weights
    layers=61,
    attention_heads=128,
    kv_heads=128,
    attention="mla",
    kv_bytes_per_token=61 * (512 + 64) * 2,  # one latent (kv_lora_rank) and one rope key a layer
    weight_bytes=round(21.21 * 16 * GIB),  # the log's 21.21 GiB a card at TP 16
    hidden_size=7168,
    intermediate_size=18432,
    vocab_size=129280,
)
QWEN3_30B_A3B = Shape(  # Qwen/Qwen3-30B-A3B config.json; total_size 61064245248 (hf-configs README, quoted)
    layers=48,
    attention_heads=32,
    kv_heads=4,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=2 * 48 * 4 * 128 * 2,
    weight_bytes=61_064_245_248,
    hidden_size=2048,
    intermediate_size=6144,
    vocab_size=151936,
)
QWEN3_235B_A22B = Shape(  # Qwen/Qwen3-235B-A22B config.json: 94 layers, 4 KV heads of 128
    layers=94,
    attention_heads=64,
    kv_heads=4,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=2 * 94 * 4 * 128 * 2,
    hidden_size=4096,
    intermediate_size=12288,
    vocab_size=151936,
)

PHI_1_5 = Shape(  # microsoft/phi-1_5 config.json: 24 layers, 32 heads, num_key_value_heads null (MHA)
    layers=24,
    attention_heads=32,
    kv_heads=32,
    head_dim=64,
    attention="mha",
    kv_bytes_per_token=2 * 24 * 32 * 64 * 2,
    weight_bytes=round(2.6419 * GIB),  # the log's "Loading model weights took 2.6419 GB"
    hidden_size=2048,
    intermediate_size=8192,
    vocab_size=51200,
)


def shape_from_fixture(name: str, total_size: int) -> Shape:
    """A shape read the way import_model reads it, from tests/fixtures/hf-configs."""
    config = json.loads((Path(__file__).parents[1] / "fixtures" / "hf-configs" / f"{name}.json").read_text())
    read = shape_from_config(config, index={"metadata": {"total_size": total_size}, "weight_map": {}})
    return Shape(**read.as_fields())


# openai/gpt-oss-20b: 24 layers alternating sliding (window 128) and full
# attention, MXFP4 experts; total_size 13761264768 (hf-configs README, quoted).
GPT_OSS_20B = shape_from_fixture("openai__gpt-oss-20b", 13_761_264_768)
# openai/gpt-oss-120b: 36 layers, 18 of them sliding (window 128); total_size as
# tests/planning/test_planning_memory.py quotes it.
GPT_OSS_120B = shape_from_fixture("openai__gpt-oss-120b", 65_248_815_744)

# Shapes of the llm-d-benchmark report's models (their config.json figures).
QWEN3_0_6B = Shape(  # Qwen/Qwen3-0.6B: 28 layers, 16 heads, 8 KV heads of 128, tied embeddings
    layers=28,
    attention_heads=16,
    kv_heads=8,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=2 * 28 * 8 * 128 * 2,
    weight_bytes=round(1.12 * GIB),  # the log's "Model loading took 1.12 GiB"
    hidden_size=1024,
    intermediate_size=3072,
    vocab_size=151936,
)
QWEN3_32B = replace(QWEN3_32B_AWQ, weight_bytes=round(61.03 * GIB))  # bf16: the log's 61.03 GiB
LLAMA_3_3_70B_FP8 = Shape(  # RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic: Llama-3.1-70B's layers, FP8 weights
    layers=80,
    attention_heads=64,
    kv_heads=8,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=2 * 80 * 8 * 128 * 2,
    weight_bytes=round(33.88 * 2 * GIB),  # the log's 33.88 GiB a card at TP 2
    hidden_size=8192,
    intermediate_size=28672,
    vocab_size=128256,
)
# Qwen/Qwen3-235B-A22B-Instruct-2507-FP8: Qwen3-235B-A22B's config.json (tests/fixtures/hf-configs, from
# /work/shared/fixtures/hf-configs: ai-dynamo/aiconfigurator model_configs) with block-FP8 weights; the
# checkpoint's total_size is not known here, so the weights are the log's "Model loading took 55.19 GiB"
# a card at TP 4.
QWEN3_235B_A22B_FP8 = shape_from_fixture("Qwen__Qwen3-235B-A22B", round(55.19 * 4 * GIB))
