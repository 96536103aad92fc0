"""Logged start-ups of vLLM 0.17 to 0.20 (and two of 0.15/0.16 from the same sweep), each planned by the
terms of its own release range (tests/planning/calibration.py says how a point is compared).

Most come from one sweep of vLLM 0.19.0 on an H100 80GB (llm-d-incubation/llm-d-planner, accuracy/results/
v0.19.0: the raw start-up logs, DEBUG level, kept in the repository at commit d3121e05 and removed two
days later), each log printing every term: "Model loading took", "Memory profiling takes ... torch peak
memory increase ... non-torch forward increase memory", "Available KV cache memory", "GPU KV cache size",
"Maximum concurrency", "Graph capturing finished ... took", "Free memory on device (78.68/79.19 GiB)". Every
run passed `--gpu-memory-utilization 0.95 --max-model-len 8192` and vLLM's serving defaults ("Defaulting
max_num_batched_tokens to 8192", "max_num_seqs to 1024 for OPENAI_API_SERVER usage context").
"""

from __future__ import annotations

from dataclasses import replace

from planning.types import Shape
from tests.planning.calibration_logged import GIB, Logged
from tests.planning.calibration_shapes import (
    LLAMA_3_3_70B_FP8,
    QWEN3_14B,
    R1_0528_QWEN3_8B,
    shape_from_fixture,
)

PLANNER = "https://github.com/llm-d-incubation/llm-d-planner/blob/d3121e059da88662db39a926a3ead964be97359b/accuracy/results/"
SWEEP = PLANNER + "v0.19.0/logs/{}--h100-80gb--tp{}pp1dp1--8192.log"
VERSIONS = PLANNER + "version-sweep/runs/qwen3-14b-vllm-v0-{}-0--h100-80gb--tp1pp1dp1--8192.json"
H100 = 79.19  # 'Free memory on device (78.68/79.19 GiB) on startup', every log of the sweep
V019 = "0.19.0 (the banner's 'version 0.19.0', 'Initializing a V1 LLM engine (v0.19.0)'; graphs outside the budget)"
ARGS = ("--gpu-memory-utilization", "0.95")
# The L40S start-up's card: its 'Estimated CUDA graph memory: 2.73 GiB total' is the step 'from 0.9000 to 0.9616'
# of its own advice line, 2.73 / 0.0616 = 44.32 GiB.
L40S = round(2.73 / 0.0616, 2)


def _fixture(name: str, weights: float, tp: int) -> Shape:
    """A config.json from tests/fixtures/hf-configs, its weights the log's "Model loading took" a card."""
    return shape_from_fixture(name, round(weights * tp * GIB))


# Qwen/Qwen2.5-72B-Instruct config.json: 80 layers, 64 heads, 8 KV heads of 128, hidden 8192, MLP 29568,
# vocabulary 152064 (the sweep's 'GPU KV cache size: 19,920 tokens' in 3.04 GiB at TP 2 is 160 KiB a token
# a card: 80 layers x 4 KV heads x 128 x 2 x 2 bytes).
QWEN2_5_72B = Shape(
    layers=80,
    attention_heads=64,
    kv_heads=8,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=2 * 80 * 8 * 128 * 2,
    hidden_size=8192,
    intermediate_size=29568,
    vocab_size=152064,
)


def _sweep(
    log: str,
    model: str,
    kind: str,
    shape: Shape,
    tp: int,
    figures: tuple[float, float, float, float, float, float],
    held_out: bool = False,
    why: str = "",
) -> Logged:
    """One start-up of the v0.19.0 sweep: ``figures`` are its weights, torch peak increase, non-torch
    increase, graphs, KV cache memory and maximum concurrency at 8192 tokens, as logged."""
    weights, activation, non_torch, graphs, kv, concurrency = figures
    return Logged(
        source=SWEEP.format(log, tp),
        engine="vllm",
        version=V019,
        model=model,
        kind=kind,
        shape=shape,
        tp=tp,
        card_gib=H100,
        card="H100 80GB",
        context=8192,
        args=ARGS,
        weights=weights,
        non_torch=non_torch,
        activation=activation,
        kv=kv / concurrency,
        cuda_graph=graphs,
        weights_from_log=True,
        held_out=held_out,
        notes=f"H100 80GB, util 0.95, 8192 tokens, 8192 batch tokens and 1024 sequences (the log's defaults); "
        f"'Model loading took {weights} GiB', 'torch peak memory increase: {activation}GiB', 'non-torch forward "
        f"increase memory: {non_torch}GiB', 'Available KV cache memory: {kv} GiB', 'Maximum concurrency for "
        f"8,192 tokens per request: {concurrency}x', 'Graph capturing finished ... took {graphs} GiB'" + why,
    )


LLAMA_8B = "meta-llama__Llama-3.1-8B-Instruct"
QWEN_7B = "Qwen__Qwen2.5-7B"
HELD_OUT = "; kept out of the fit"

VLLM_CURRENT: tuple[Logged, ...] = (
    _sweep(
        "meta-llama-llama-3-1-8b-",
        "meta-llama/Llama-3.1-8B-Instruct",
        "GQA",
        _fixture(LLAMA_8B, 14.99, 1),
        1,
        (14.99, 1.89, 0.25, 0.91, 58.11, 58.11),
    ),
    _sweep(
        "meta-llama-llama-3-1-8b-",
        "meta-llama/Llama-3.1-8B-Instruct",
        "GQA",
        _fixture(LLAMA_8B, 7.51, 2),
        2,
        (7.51, 1.89, 2.07, 0.76, 63.76, 127.53),
    ),
    _sweep(
        "meta-llama-llama-3-1-8b-",
        "meta-llama/Llama-3.1-8B-Instruct",
        "GQA",
        _fixture(LLAMA_8B, 3.77, 4),
        4,
        (3.77, 1.89, 2.13, 0.67, 67.44, 269.75),
        held_out=True,
        why=HELD_OUT
        + ": at TP 4 graphs (0.67) and memory beside the weights (2.13) come under the flat terms",
    ),
    _sweep(
        "qwen-qwen2-5-7b-instruct",
        "Qwen/Qwen2.5-7B-Instruct",
        "GQA, large vocabulary",
        _fixture(QWEN_7B, 14.25, 1),
        1,
        (14.25, 2.21, 0.24, 0.87, 58.53, 133.79),
    ),
    _sweep(
        "qwen-qwen2-5-7b-instruct",
        "Qwen/Qwen2.5-7B-Instruct",
        "GQA, large vocabulary",
        _fixture(QWEN_7B, 7.12, 2),
        2,
        (7.12, 2.21, 2.06, 0.71, 63.84, 291.82),
        held_out=True,
        why=HELD_OUT,
    ),
    _sweep(
        "qwen-qwen2-5-7b-instruct",
        "Qwen/Qwen2.5-7B-Instruct",
        "GQA, large vocabulary",
        _fixture(QWEN_7B, 3.55, 4),
        4,
        (3.55, 2.21, 2.13, 0.64, 67.34, 615.63),
        held_out=True,
        why=HELD_OUT,
    ),
    _sweep(
        "qwen-qwen3-30b-a3b",
        "Qwen/Qwen3-30B-A3B",
        "MoE",
        _fixture("Qwen__Qwen3-30B-A3B", 56.88, 1),
        1,
        (56.88, 2.68, 0.27, 1.41, 15.41, 20.54),
        why="; the peak is the sampler's 1024 rows beside the fused-MoE workspaces the forward pass left "
        "(engines.toml sources.activation)",
    ),
    _sweep(
        "mistralai-mixtral-8x7b-i",
        "mistralai/Mixtral-8x7B-Instruct-v0.1",
        "MoE",
        _fixture("mistralai__Mixtral-8x7B-v0.1", 43.51, 2),
        2,
        (43.51, 1.21, 2.07, 0.93, 28.44, 56.88),
        why="; planned from Mixtral-8x7B-v0.1's config.json (the Instruct model's is the same shape)",
    ),
    _sweep(
        "qwen-qwen2-5-72b-instruc",
        "Qwen/Qwen2.5-72B-Instruct",
        "GQA",
        replace(QWEN2_5_72B, weight_bytes=round(67.80 * 2 * GIB)),
        2,
        (67.80, 2.29, 2.09, 1.61, 3.04, 2.43),
        why="; the issue's 72B dense model on two 80 GB cards, here at 0.95",
    ),
    _sweep(
        "fp8dyn-llama-3-3-70b",
        "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic",
        "GQA, quantized",
        replace(LLAMA_3_3_70B_FP8, weight_bytes=round(16.96 * 4 * GIB)),
        4,
        (16.96, 1.97, 2.21, 1.66, 54.09, 86.55),
    ),
    _sweep(
        "fp8dyn-llama-3-3-70b",
        "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic",
        "GQA, quantized",
        replace(LLAMA_3_3_70B_FP8, weight_bytes=round(33.88 * 2 * GIB)),
        2,
        (33.88, 1.96, 2.10, 1.79, 37.28, 29.82),
        held_out=True,
        why=HELD_OUT,
    ),
    _sweep(
        "qwen-qwen3-8b",
        "Qwen/Qwen3-8B",
        "GQA, large vocabulary",
        replace(R1_0528_QWEN3_8B, weight_bytes=round(15.27 * GIB)),
        1,
        (15.27, 2.21, 0.25, 0.96, 57.50, 51.11),
        held_out=True,
        why=HELD_OUT + "; planned from DeepSeek-R1-0528-Qwen3-8B's shape, which is Qwen3-8B's config",
    ),
    _sweep(
        "deepseek-ai-deepseek-v2-",
        "deepseek-ai/DeepSeek-V2-Lite-Chat",
        "MLA, MoE",
        _fixture("deepseek-ai__DeepSeek-V2-Lite", 29.43, 1),
        1,
        (29.43, 1.93, 0.26, 1.57, 43.61, 183.78),
        held_out=True,
        why=HELD_OUT
        + ": its graphs (1.57 GiB over 27 layers) are the sweep's largest a layer, under the term",
    ),
    _sweep(
        "openai-gpt-oss-20b",
        "openai/gpt-oss-20b",
        "sliding window, MoE, quantized",
        _fixture("openai__gpt-oss-20b", 7.01, 2),
        2,
        (7.01, 2.87, 2.07, 1.55, 59.32, 316.07),
        held_out=True,
        why=HELD_OUT + " (MXFP4 experts: the planner pads them, 7.66 GiB planned against 7.01 loaded)",
    ),
    Logged(
        source=VERSIONS.format(17),
        engine="vllm",
        version="0.17.0 (the sweep's image, vllm-v0-17-0; graphs outside the budget)",
        model="Qwen/Qwen3-14B",
        kind="GQA, large vocabulary",
        shape=replace(QWEN3_14B, weight_bytes=round(27.52 * GIB)),
        tp=1,
        card_gib=H100,
        card="H100 80GB",
        context=8192,
        args=ARGS,
        weights=27.52,
        non_torch=0.13,
        activation=2.23,
        kv=45.34 / 36.27,
        weights_from_log=True,
        notes="the same H100 sweep's release run (its record of the log: weight_memory_gib 27.52, "
        "activation_memory_gib 2.23, non_torch_forward_memory_gib 0.13, kv_cache_memory_gib 45.34, "
        "max_concurrency 36.27); no graph figure recorded, so graphs are not compared",
    ),
    Logged(
        source=VERSIONS.format(18),
        engine="vllm",
        version="0.18.0 (the sweep's image, vllm-v0-18-0; graphs outside the budget)",
        model="Qwen/Qwen3-14B",
        kind="GQA, large vocabulary",
        shape=replace(QWEN3_14B, weight_bytes=round(27.52 * GIB)),
        tp=1,
        card_gib=H100,
        card="H100 80GB",
        context=8192,
        args=ARGS,
        weights=27.52,
        non_torch=0.25,
        activation=2.23,
        kv=45.23 / 36.18,
        cuda_graph=0.90,
        weights_from_log=True,
        held_out=True,
        notes="the same sweep's release run: weights 27.52, activation 2.23, non-torch 0.25, graphs 0.9, KV "
        "45.23 GiB at 36.18x; kept out of the fit",
    ),
    Logged(
        source=VERSIONS.format(16),
        engine="vllm",
        version="0.16.0 (the sweep's image, vllm-v0-16-0; the sampler sorts the logits)",
        model="Qwen/Qwen3-14B",
        kind="GQA, large vocabulary",
        shape=replace(QWEN3_14B, weight_bytes=round(27.52 * GIB)),
        tp=1,
        card_gib=H100,
        card="H100 80GB",
        context=8192,
        args=ARGS,
        weights=27.52,
        non_torch=0.13,
        activation=5.64,
        kv=41.94 / 33.55,
        weights_from_log=True,
        held_out=True,
        notes="the same sweep, one release before the sampler change: activation 5.64 GiB where 0.17.0 logs "
        "2.23 (0.15.0 logs the same figures); kept out of the fit; no graph figure recorded",
    ),
    Logged(
        source="stored public file, search-index id 53041548781: an EKS course's vLLM lesson (Qwen2.5-72B-Instruct on "
        "a g6e.12xlarge, 4 x L40S 48GB), its `kubectl logs` of vllm/vllm-openai:latest",
        engine="vllm",
        version="0.19.0 (the banner's 'version 0.19.0'; graphs outside the budget)",
        model="Qwen/Qwen2.5-72B-Instruct",
        kind="GQA",
        shape=replace(QWEN2_5_72B, weight_bytes=round(33.98 * 4 * GIB)),
        tp=4,
        # 44.32 GiB from the log's own advice line (an L40S: a 0.8-era log naming NVIDIA_L40S prints 44.31, stored
        # public file, search-index id 57044493590)
        card_gib=L40S,
        card="L40S",
        context=8192,
        args=("--gpu-memory-utilization", "0.90"),
        weights=33.98,
        non_torch=L40S * 0.90 - 33.98 - 5.11,
        activation=0.0,
        combined=True,
        kv=5.11 / 8.18,
        cuda_graph=2.62,
        weights_from_log=True,
        held_out=True,
        notes="4 x L40S over PCIe ('Custom allreduce is disabled because it's not supported on more than two "
        "PCIe-only GPUs'), --max-model-len 8192, util 0.90: 'Model loading took 33.98 GiB', 'Available KV cache "
        "memory: 5.11 GiB', 'GPU KV cache size: 67,024 tokens', 'Maximum concurrency for 8,192 tokens per "
        "request: 8.18x', 'Graph capturing finished in 24 secs, took 2.62 GiB'; kept out of the fit: graphs "
        "without custom all-reduce take more than the term",
    ),
)

# Logs of these releases read and not held, with why (docs/memory-model.md lists them).
NOT_HELD_CURRENT: tuple[tuple[str, str], ...] = (
    (
        PLANNER + "v0.19.0/results_raw.csv",
        "The same vLLM 0.19.0 H100 sweep's other runs: gemma-2 and gemma-3 (sliding-window layers, gemma-3 "
        "multimodal), CodeLlama, granite, phi-2/phi-4, Mistral-Small-3.1, Llama-4-Scout, Kimi-VL, Kimi-Dev-72B, "
        "Qwen1.5-MoE and the quantized variants. Not held: no copy of their config.json is kept here "
        "(tests/fixtures/hf-configs), and several are multimodal, whose encoder profiling the planner does not "
        "shape; the pipeline-parallel runs (Llama-3.1-8B at PP 2 and 4: activation 1.10 and 1.05 GiB, non-torch "
        "0.07) because the calibration compares tensor-parallel ranks only; --kv-cache-dtype fp8, --dtype float32 "
        "and runtime --quantization fp8 runs, which change figures the shape takes as the model's own.",
    ),
    (
        "stored public file, search-index id 69451098589 (a project's model notes, RTX 5090, September 2026)",
        "Qwen/Qwen3-14B-AWQ and Qwen3-32B-AWQ on one RTX 5090 (31.36 GiB): 'Free memory on device (30.86/31.36 "
        "GiB) ... (0.7, 21.95 GiB). Actual usage is 11.22 GiB for consumed memory (weights + non-torch), 1.46 GiB "
        "for peak activation, and 0.52 GiB for CUDAGraph memory. Current kv cache memory in use is 9.27 GiB', "
        "'GPU KV cache size: 60,768 tokens'. The notes never name the vLLM release, so the range whose terms "
        "would plan it cannot be named; left out.",
    ),
    (
        "stored public file, search-index id 67144197265 (a test script's captured output, vLLM 0.22.0)",
        "Qwen/Qwen2.5-7B-Instruct at TP 1, util 0.95, 4096 tokens, 2048 batch tokens: 'Model loading took 14.29 "
        "GiB', 'Estimated CUDA graph memory: 0.37 GiB total', 'Available KV cache memory: 26.32 GiB', 'GPU KV "
        "cache size: 492,912 tokens', 'increase --gpu-memory-utilization to 0.9583', 'took 0.31 GiB'. The card "
        "is not named and 0.22 prints its total only at DEBUG; 0.37 GiB over the 0.0083 step puts it between "
        "43.7 and 45.5 GiB (a 48 GB card), too loose for what the budget kept beside weights and cache to be "
        "read within 5%; left out.",
    ),
    (
        "stored public file, search-index id 61511710941 (a GLM-5.2-NVFP4 start-up, 2026-08-20)",
        "vLLM 0.26.0, GLM-5.2 NVFP4 at TP 4 with expert parallelism on 184.31 GiB cards: 106.69 GiB weights, "
        "6.31 activation, 0.95 non-torch, 4.13 graphs. Sparse MLA with an indexer cache and expert parallelism, "
        "neither of which the planner shapes; left out.",
    ),
    (
        "stored public file, search-index id 7292846353 (a Qwen3-Next-80B-A3B start-up, vLLM 0.10.2)",
        "Qwen3-Next at TP 2 on H200s: 74.28 GiB weights, 5.58 activation, 1.38 non-torch, 2.37 graphs. A hybrid "
        "Gated DeltaNet model the planner does not shape, and a 0.10 release; left out.",
    ),
    (
        "stored public file, search-index id 71198863849 (a serving deck's boot parser, vLLM 0.29)",
        "A Qwen3-Next-style model with MTP drafting on a 94.97 GiB card: 81.7 GiB consumed, 1.78 activation, 0.28 "
        "graphs, 8.64 KV. Hybrid model with a drafter and no model named; left out.",
    ),
)
