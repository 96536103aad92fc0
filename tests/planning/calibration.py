"""Logged engine start-ups the memory model is held to (tests/planning/test_memory_calibration.py)
and the table docs/memory-model.md shows (``python -m tests.planning.calibration`` prints it).

Each point is one public start-up log: the figures the engine printed per card
(GiB as logged), the settings it ran with (as the log or that release's
defaults give them), and the model's shape. "Logged need" is the sum of the
terms the log prints; the planned need sums the planner's same terms, so a
term the log does not print (CUDA graphs in V0's profile, the KV cache when
no concurrency line was logged) is left out of both, and the table says so.
The KV term logged is what one full-context sequence takes: the KV cache
memory over vLLM's "Maximum concurrency" for that context.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from catalog.modelfiles import shape_from_config
from planning.engines import terms_for
from planning.memory import card_memory
from planning.types import CardMemory, Shape

GIB = 2**30


@dataclass(frozen=True)
class Logged:
    """One start-up, as its log printed it, per card, in GiB."""

    source: str
    engine: str
    version: str
    model: str
    kind: str  # what it exercises: GQA, MHA, MoE, MLA, sliding window, quantized
    shape: Shape
    tp: int
    card_gib: float  # total_gpu_memory as logged
    context: int
    args: tuple[str, ...]
    weights: float
    non_torch: float
    activation: float
    kv: float | None = None  # one full-context sequence: KV memory / maximum concurrency
    cuda_graph: float | None = None
    weights_from_log: bool = False  # the checkpoint's size is not known here; the log's stands in
    # V1 logs print no split of the profile: ``non_torch`` then holds what the
    # budget keeps beside weights and KV cache (total x utilization - "Model
    # loading took" - the KV cache), activation peak and non-torch memory together.
    combined: bool = False
    excluded: str = ""  # why this point is shown but not held to the bound
    # A start-up of a current release kept out of the fit: held to the wider held-out bound.
    held_out: bool = False
    notes: str = ""

    @property
    def need(self) -> float:
        return self.weights + self.non_torch + self.activation + (self.kv or 0) + (self.cuda_graph or 0)


@dataclass(frozen=True)
class Compared:
    point: Logged
    memory: CardMemory
    planned: float  # GiB, the same terms as logged
    terms: dict[str, float] = field(default_factory=dict)

    @property
    def error(self) -> float:
        return self.planned / self.point.need - 1

    @property
    def rule(self) -> float:
        """Others' rule of thumb: weights x 1.2 + 2 GiB (with the same KV term)."""
        return self.point.weights * 1.2 + 2 + (self.point.kv or 0)


def plan(point: Logged) -> Compared:
    """The planner's figures for the point's start-up, on its card, with its settings."""
    args = point.args if point.cuda_graph is not None else (*point.args, "--enforce-eager")
    release = re.search(r"\d+\.\d+(?:\.\d+)*", point.version)
    memory = card_memory(
        terms_for(point.engine, release[0] if release else None),
        point.shape,
        point.tp,
        point.context,
        None,
        total=round(point.card_gib * GIB),
        args=args,
    )
    assert memory is not None
    # Graphs are compared where the log gives them, whether the release counts them inside its budget or
    # beside it (vLLM 0.11 to 0.20 capture them after sizing the cache).
    terms = {t.name: t.bytes / GIB for t in memory.terms if t.inside or t.name == "cuda_graph"}
    planned = (
        memory.weights / GIB
        + terms.get("activation", 0)
        + terms.get("non_torch", 0)
        + terms.get("comm_buffers", 0)
        + terms.get("cuda_graph", 0)
        + (memory.kv / GIB if point.kv is not None else 0)
    )
    return Compared(point, memory, planned, terms)


# -- shapes (config.json figures; tests/fixtures/hf-configs where there is one) --

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


def _from_fixture(name: str, total_size: int) -> Shape:
    """A shape read the way import_model reads it, from tests/fixtures/hf-configs."""
    config = json.loads((Path(__file__).parents[1] / "fixtures" / "hf-configs" / f"{name}.json").read_text())
    read = shape_from_config(config, index={"metadata": {"total_size": total_size}, "weight_map": {}})
    return Shape(**read.as_fields())


# openai/gpt-oss-20b: 24 layers alternating sliding (window 128) and full
# attention, MXFP4 experts; total_size 13761264768 (hf-configs README, quoted).
GPT_OSS_20B = _from_fixture("openai__gpt-oss-20b", 13_761_264_768)
# openai/gpt-oss-120b: 36 layers, 18 of them sliding (window 128); total_size as
# tests/planning/test_planning_memory.py quotes it.
GPT_OSS_120B = _from_fixture("openai__gpt-oss-120b", 65_248_815_744)

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
LLM_D = (
    "https://github.com/llm-d/llm-d-benchmark/blob/259334868c5075da530cc6c90b43fceb11b6e6a7/"
    "config_explorer/empirical-vllm-memory-results.md"
)
# A public GitHub file read in the search index's stored copies, whose repository and path the index did
# not name: cited by the index's file id (its read_file id), so the figures can be read again there.
STORED = "stored public file, search-index id "
LLM_D_VERSION = "0.11 (V1; as the gpt-oss-20b point of the same report)"
LLM_D_NOTES = (
    "H100 80 GB ('Free memory on device: 78.57/79.18 GiB on startup'), utilization 0.9, --max-model-len {context}, "
    "--enable-prefix-caching; the report's DEBUG figures; the row's CUDA-graph figure ({graphs}) is not a size, "
    "so graphs are not compared; no concurrency line, so KV is not compared"
)


# V0 without chunked prefill profiles max(max_model_len, 2048) batch tokens
# and 256 sequences (vllm/config.py SchedulerConfig, v0.6-0.8).
V0 = ("--max-num-seqs", "256")


def v0_batch(context: int) -> tuple[str, ...]:
    return (*V0, "--max-num-batched-tokens", str(max(context, 2048)))


POINTS: tuple[Logged, ...] = (
    Logged(
        source="https://github.com/vllm-project/vllm/issues/10517",
        engine="vllm",
        version="0.6.4 (V0)",
        model="meta-llama/Llama-3.1-8B-Instruct",
        kind="GQA",
        shape=LLAMA_3_8B,
        tp=1,
        card_gib=23.58,
        context=20000,
        args=v0_batch(20000),
        weights=14.99,
        non_torch=0.35,
        activation=17.06 - 14.99,  # peak_torch_memory - weights
        kv=3.81 / 1.56,
        notes="RTX 3090; kv_cache_size 3.81 GiB, concurrency 1.56x",
    ),
    Logged(
        source="https://github.com/vllm-project/vllm/issues/10517",
        engine="vllm",
        version="0.6.4 (V0)",
        model="meta-llama/Llama-3.1-8B-Instruct",
        kind="GQA",
        shape=LLAMA_3_8B,
        tp=1,
        card_gib=23.58,
        context=29000,
        args=v0_batch(29000),
        weights=14.99,
        non_torch=0.35,
        activation=17.98 - 14.99,
        kv=2.89 / 0.82,
        notes="RTX 3090; the engine refused this one: the cache holds 0.82 sequences",
    ),
    Logged(
        source="https://github.com/vllm-project/vllm/issues/13882",
        engine="vllm",
        version="0.7.x (V0)",
        model="Qwen/Qwen2.5-7B-Instruct-AWQ",
        kind="quantized",
        shape=QWEN2_5_7B_AWQ,
        tp=1,
        card_gib=8.00,
        context=4096,
        args=(*v0_batch(4096), "--gpu-memory-utilization", "0.7"),
        weights=5.20,
        non_torch=0.03,
        activation=1.42,
        weights_from_log=True,
        notes="RTX 4060; KV not logged (the cache came out at -1.05 GiB)",
    ),
    Logged(
        source="https://github.com/xming521/WeClone/issues/101",
        engine="vllm",
        version="0.8.x (V0)",
        model="Qwen/Qwen2.5-7B-Instruct-AWQ",
        kind="quantized",
        shape=QWEN2_5_7B_AWQ,
        tp=1,
        card_gib=15.99,
        context=3072,
        args=v0_batch(3072),
        weights=5.20,
        non_torch=0.05,
        activation=1.41,
        kv=7.73 / 47.12,
        cuda_graph=0.64,
        weights_from_log=True,
        notes="16 GiB card; 'Graph capturing finished in 31 secs, took 0.64 GiB'",
    ),
    Logged(
        source="https://github.com/vllm-project/vllm/issues/15815",
        engine="vllm",
        version="0.7.x (V0)",
        model="Qwen/Qwen2.5-32B-Instruct",
        kind="GQA",
        shape=QWEN2_5_32B,
        tp=2,
        card_gib=44.42,
        context=10000,
        args=v0_batch(10000),
        weights=30.71,
        non_torch=0.30,
        activation=1.26,
        weights_from_log=True,
        notes="2 x L40S over PCIe; KV concurrency line cut off",
    ),
    Logged(
        source="https://github.com/vllm-project/vllm/issues/13061",
        engine="vllm",
        version="0.7.2 (V0, chunked prefill above 32K)",
        model="deepseek-ai/DeepSeek-R1-Distill-Qwen-14B",
        kind="GQA",
        shape=R1_DISTILL_14B,
        tp=2,
        card_gib=23.55,
        context=131072,
        args=(*V0, "--max-num-batched-tokens", "2048", "--gpu-memory-utilization", "0.98"),
        weights=13.9476,
        non_torch=0.25,
        activation=0.19,
        weights_from_log=True,
        notes="2 x RTX 4090 over PCIe; the full context did not fit (81536 tokens), so KV is not compared",
    ),
    Logged(
        source="https://github.com/vllm-project/vllm/issues/12529",
        engine="vllm",
        version="0.7.x (V0)",
        model="deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
        kind="GQA, large vocabulary",
        shape=R1_DISTILL_1_5B,
        tp=1,
        card_gib=7.75,
        context=2000,
        args=v0_batch(2000),
        weights=3.34,
        non_torch=0.04,
        activation=1.39,
        kv=2.20 / 41.18,
        weights_from_log=True,
        notes="8 GiB card; the sampler's peak dominates",
    ),
    Logged(
        source="https://github.com/vllm-project/vllm/pull/14447",
        engine="vllm",
        version="0.8.3rc2 (V0)",
        model="DeepSeek-R1 AWQ (wanzhenchn/DeepSeek-R1-AWQ)",
        kind="MLA, MoE, quantized",
        shape=DEEPSEEK_R1_AWQ,
        tp=16,
        card_gib=23.58,
        context=2048,
        # max_seq_len 2048 without chunked prefill; CUDA graphs captured for 8, 4, 2, 1
        # sequences, which V0 caps at max_num_seqs.
        args=(*v0_batch(2048)[2:], "--max-num-seqs", "8", "--gpu-memory-utilization", "0.99"),
        weights=21.21,
        non_torch=0.20,
        activation=0.37,
        weights_from_log=True,
        notes="16 x RTX 3090; 'model weights take 21.21GiB; non_torch_memory takes 0.20GiB; "
        "PyTorch activation peak memory takes 0.37GiB' on every worker",
    ),
    Logged(
        source="https://github.com/vllm-project/vllm/issues/17469",
        engine="vllm",
        version="0.8.5 (V1)",
        model="Qwen/Qwen3-30B-A3B",
        kind="MoE",
        shape=QWEN3_30B_A3B,
        tp=4,
        # A10: 'GPU 0 has a total capacity of 22.18 GiB' (OpenBMB/MiniCPM-V#640, an A10 24G)
        card_gib=22.18,
        context=8192,
        args=(),  # 0.8.5's defaults: utilization 0.9, 2048 batch tokens, 256 sequences
        weights=14.2474,
        # 22.18 x 0.9 - 14.2474 (Model loading took) - 198,784 tokens x 24 KiB (the KV cache)
        non_torch=22.18 * 0.9 - 14.2474 - 198_784 * 2 * 48 * 1 * 128 * 2 / GIB,
        activation=0.0,
        combined=True,
        kv=198_784 * 2 * 48 * 1 * 128 * 2 / GIB / 24.27,
        notes="4 x A10; 'GPU KV cache size: 198,784 tokens', 'Maximum concurrency for 8,192 tokens "
        "per request: 24.27x'; one KV head of 128 a card at TP 4",
    ),
    Logged(
        source="https://github.com/Q07K/langgraph-mcp-example/blob/4ef5c829d8092a427b3f9f9397f4fa920b07348c/README.md",
        engine="vllm",
        version="0.8.x (V0: the log's worker.py:267 profile lines)",
        model="Qwen/Qwen3-4B",
        kind="GQA",
        shape=QWEN3_4B,
        tp=1,
        card_gib=12.00,
        context=10000,
        # app/llm/entrypoint.sh: --gpu-memory-utilization 0.95, --max-num-seqs from the
        # run's max_num_seqs=1, --max-model-len 10k (the log: 10000 tokens)
        args=(*v0_batch(10000)[2:], "--max-num-seqs", "1", "--gpu-memory-utilization", "0.95"),
        weights=7.56,
        non_torch=0.04,
        activation=0.74,
        kv=3.06 / 2.23,
        weights_from_log=True,
        notes="RTX 2060 12 GB, fp16; 'Maximum concurrency for 10000 tokens per request: 2.23x'",
    ),
    Logged(
        source="https://github.com/jackypanster/deploy-qwen/blob/6bace0f77213f196c0eec0898b4479f2fc4ea5de/logs/deploy-32k-startup.log",
        engine="vllm",
        version="0.8.5 (V0: 'Compute Capability < 8.0 is not supported by the V1 Engine')",
        model="Qwen/Qwen3-30B-A3B",
        kind="MoE",
        shape=QWEN3_30B_A3B,
        tp=4,
        card_gib=21.66,
        context=32768,
        args=(
            *V0,
            "--max-num-batched-tokens",
            "4096",
            "--gpu-memory-utilization",
            "0.93",
            "--block-size",
            "32",
        ),
        weights=14.25,
        non_torch=0.20,
        activation=1.40,
        kv=4.30 / 5.73,
        notes="4 x RTX 2080 Ti 22 GB over PCIe, fp16, chunked prefill; rank 0's profile (it runs the sampler, "
        "1.40 GiB against 0.25 on the other ranks, so its cache is the smallest); 'Maximum concurrency for "
        "32768 tokens per request: 5.73x'",
    ),
    Logged(
        source="https://github.com/jackypanster/deploy-qwen/blob/c7039f6ac6e255cabea9541106152745ea20601d/blog-post.md",
        engine="vllm",
        version="0.8.5 (V0, the same cards as the point above)",
        model="Qwen/Qwen3-30B-A3B",
        kind="MoE",
        shape=QWEN3_30B_A3B,
        tp=4,
        card_gib=21.66,
        context=131072,
        args=(
            *V0,
            "--max-num-batched-tokens",
            "2048",
            "--gpu-memory-utilization",
            "0.92",
            "--block-size",
            "32",
        ),
        weights=14.27,
        non_torch=0.20,
        activation=1.39,
        notes="YaRN x4 to 131072 tokens; KV not compared: the post's concurrency line (1.21x) does not match "
        "its 4.07 GiB cache (1.36x at 24 KiB a token), so the two lines come from different runs",
    ),
    Logged(
        source="https://github.com/jackypanster/qwen3-32b-awq/blob/b8df6b20754ead3591bfcdcdebe162f7fadbf608/log.output",
        engine="vllm",
        version="0.8.5 (V0: compute capability 7.5)",
        model="Qwen/Qwen3-32B-AWQ",
        kind="quantized",
        shape=QWEN3_32B_AWQ,
        tp=4,
        card_gib=21.48,
        context=32768,
        args=(
            "--max-num-seqs",
            "64",
            "--max-num-batched-tokens",
            "32768",
            "--gpu-memory-utilization",
            "0.96",
        ),
        weights=4.58,
        non_torch=0.20,
        activation=2.74,
        kv=13.10 / 6.55,
        weights_from_log=True,
        notes="4 x RTX 2080 Ti 22 GB over PCIe; the forward pass of 32768 batch tokens is the peak on every "
        "rank; 'Maximum concurrency for 32768 tokens per request: 6.55x'",
    ),
    Logged(
        source="https://github.com/jackypanster/deploy-DeepSeek-R1-0528-Qwen3-8B/blob/02cf841e06a979472256d8b157c07faaab6d549c/output.log",
        engine="vllm",
        version="0.8.5 (V0: compute capability 7.5)",
        model="deepseek-ai/DeepSeek-R1-0528-Qwen3-8B",
        kind="GQA",
        shape=R1_0528_QWEN3_8B,
        tp=4,
        card_gib=21.48,
        context=65536,
        args=(*V0, "--max-num-batched-tokens", "8192", "--gpu-memory-utilization", "0.93"),
        weights=3.85,
        non_torch=0.20,
        activation=1.45,
        kv=14.49 / 6.44,
        weights_from_log=True,
        notes="4 x RTX 2080 Ti 22 GB, fp16, --enforce-eager, chunked prefill above 32K; rank 0's sampler peak "
        "(1.45 GiB, the other ranks 0.46); 'Maximum concurrency for 65536 tokens per request: 6.44x'",
    ),
    Logged(
        source="https://zhuanlan.zhihu.com/p/1916529253169734444",
        engine="vllm",
        version="0.8.5 (V0: a V100, compute capability 7.0)",
        model="Qwen/Qwen2.5-7B-Instruct",
        kind="GQA",
        shape=QWEN2_5_7B,
        tp=1,
        card_gib=31.74,
        context=32768,
        # LLM(model=..., dtype="float16") with every other setting at its default:
        # the config's 32768 tokens, no chunked prefill at 32K, so 32768 batch tokens
        args=v0_batch(32768),
        weights=14.25,
        non_torch=0.09,
        activation=4.35,
        notes="V100 32 GB, fp16 (kaiyuan, 'vLLM显存管理详解', 2025-06-13); the forward pass of 32768 "
        "batch tokens is the peak; KV not logged (no concurrency line)",
    ),
    Logged(
        source="https://github.com/xlisp/jimw-vllm/blob/1906376f23119befadd5cd79c75fe2c9f05da1a5/README.md",
        engine="vllm",
        version="0.6.4.post1 (V0; the log's 'Initializing an LLM engine (v0.6.4.post1)')",
        model="microsoft/phi-1_5",
        kind="MHA",
        shape=PHI_1_5,
        tp=1,
        card_gib=7.92,
        context=2048,
        args=v0_batch(2048),  # LLM(model="microsoft/phi-1_5"): every setting at its default
        weights=2.6419,
        non_torch=0.47,
        activation=3.12 - 2.6419,  # peak_torch_memory - weights
        kv=3.54 / 9.43,
        cuda_graph=0.54,
        weights_from_log=True,
        notes="GeForce GTX 1080 8 GB, fp16, XFormers; 32 KV heads of 64 (num_key_value_heads null); 'Maximum "
        "concurrency for 2048 tokens per request: 9.43x'; 'Graph capturing finished in 21 secs, took 0.54 GiB'",
    ),
    Logged(
        source="https://github.com/llm-d/llm-d-benchmark/blob/0282dcf693ff0633bce345e1f1f72b27a37e6a79/config_explorer/empirical-vllm-memory-results.md",
        engine="vllm",
        version="0.11 (V1; the report's later revision pins vllm/vllm-openai:v0.11.0, and its "
        "--kv-cache-memory advice is logged from 0.11)",
        model="openai/gpt-oss-20b",
        kind="sliding window, MoE, quantized",
        shape=GPT_OSS_20B,
        tp=1,
        card_gib=79.18,
        context=16000,
        # --max-model-len 16000 --block-size 128 --enable-prefix-caching, utilization 0.9;
        # an H100 takes 0.11's large-card defaults (8192 batch tokens, 1024 sequences)
        args=("--block-size", "128"),
        weights=13.47,
        non_torch=0.13,
        activation=7.38,
        cuda_graph=0.39,
        notes="H100 80 GB ('Free memory on device: 78.57/79.18 GiB on startup'), DEBUG log figures as the report "
        "transcribes them: weights 13.47, torch peak increase 7.38, non-torch 0.13, CUDA graphs 0.39, KV cache "
        "50.28 GiB (71.26 GiB in all); no concurrency line, so KV is not compared; the 1024-sequence sampler "
        "run is the peak",
    ),
    Logged(
        source=LLM_D,
        engine="vllm",
        version=LLM_D_VERSION,
        model="meta-llama/Llama-3.1-8B-Instruct",
        kind="GQA",
        shape=LLAMA_3_8B,
        tp=1,
        card_gib=79.18,
        context=16000,
        args=("--block-size", "128"),
        weights=14.99,
        non_torch=0.13,
        activation=4.76,
        notes=LLM_D_NOTES.format(context=16000, graphs="-0.45 GiB"),
    ),
    Logged(
        source=LLM_D,
        engine="vllm",
        version=LLM_D_VERSION,
        model="Qwen/Qwen3-0.6B",
        kind="GQA, large vocabulary",
        shape=QWEN3_0_6B,
        tp=1,
        card_gib=79.18,
        context=16000,
        args=("--block-size", "128"),
        weights=1.12,
        non_torch=0.13,
        activation=5.56,
        cuda_graph=0.10,
        weights_from_log=True,
        notes=LLM_D_NOTES.format(context=16000, graphs="0.10 GiB, compared"),
    ),
    Logged(
        source=LLM_D,
        engine="vllm",
        version=LLM_D_VERSION,
        model="Qwen/Qwen3-32B",
        kind="GQA",
        shape=QWEN3_32B,
        tp=1,
        card_gib=79.18,
        context=16000,
        args=("--block-size", "128"),
        weights=61.03,
        non_torch=0.14,
        activation=5.64,
        weights_from_log=True,
        notes=LLM_D_NOTES.format(context=16000, graphs="-0.88 GiB"),
    ),
    Logged(
        source=LLM_D,
        engine="vllm",
        version=LLM_D_VERSION,
        model="RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic",
        kind="GQA, quantized",
        shape=LLAMA_3_3_70B_FP8,
        tp=2,
        card_gib=79.18,
        context=16000,
        args=("--block-size", "128"),
        weights=33.88,
        non_torch=0.55,
        activation=4.84,
        weights_from_log=True,
        notes=LLM_D_NOTES.format(context=16000, graphs="-0.42 GiB"),
    ),
    Logged(
        source=LLM_D,
        engine="vllm",
        version=LLM_D_VERSION,
        model="Qwen/Qwen3-0.6B",
        kind="GQA, large vocabulary",
        shape=QWEN3_0_6B,
        tp=1,
        card_gib=79.18,
        context=32000,
        args=("--block-size", "128"),
        weights=1.12,
        non_torch=0.13,
        activation=5.56,
        cuda_graph=0.10,
        weights_from_log=True,
        held_out=True,
        notes=LLM_D_NOTES.format(context=32000, graphs="0.10 GiB, compared")
        + "; kept out of the fit: a second start-up of the same model at twice the context",
    ),
    Logged(
        source=STORED + "70682754770: notes of a vLLM start-up ('Session 2', 'Actual logs: Run2'), "
        "vllm/vllm-openai:v0.31.0-ubuntu2404 on an A100 80GB",
        engine="vllm",
        version="0.31.0 (the image's tag; V1, CUDA graphs profiled inside the budget)",
        model="meta-llama/Llama-3.1-8B-Instruct",
        kind="GQA",
        shape=LLAMA_3_8B,
        tp=1,
        card_gib=79.25,
        context=131072,
        # `--model meta-llama/Llama-3.1-8B-Instruct` and nothing else: the release's defaults, its 'Desired
        # GPU memory utilization is (0.92, 72.91 GiB)' among them; planned without a class name, so with
        # the large-card defaults (8192 batch tokens, 1024 sequences), which the logged peak bears out
        args=(),
        weights=15.0,
        non_torch=15.26 - 15.0,  # 'Actual usage is 15.26 GiB for consumed memory (weights + non-torch)'
        activation=1.44,
        kv=56.21 / 3.51,
        cuda_graph=0.23,
        notes="A100 80GB ('Free memory on device (78.84/79.25 GiB) on startup'); 'Model loading took 15.0 GiB', "
        "'1.44 GiB for peak activation, and 0.23 GiB for CUDAGraph memory', 'Available KV cache memory: 56.21 GiB', "
        "'GPU KV cache size: 460,496 tokens, Maximum concurrency for 131,072 tokens per request: 3.51x'. The peak is "
        "2.9 fp32 copies of 1024 x 128256 logits (4 planned); with 256 sequences no copy count the source allows "
        "reaches it, so the large-card defaults are taken for this A100 (not checked in 0.31's source)",
    ),
    Logged(
        source="https://github.com/vllm-project/vllm/pull/10511",
        engine="vllm",
        version="0.6.5.dev (the profiler rewrite)",
        model="meta-llama/Meta-Llama-3-8B",
        kind="GQA",
        shape=LLAMA_3_8B,
        tp=1,
        card_gib=79.22,
        context=8192,
        args=v0_batch(8192),
        weights=14.96,
        non_torch=1.79,
        activation=1.26,
        excluded=(
            "logged by the pull request that rewrote the profiler, before release: its non-torch 1.79 GiB "
            "at TP 1 is 0.16 GiB on the same card a month later (vllm#12126); its TP 2 - TP 1 difference "
            "is where comm_buffers comes from"
        ),
    ),
    Logged(
        source="https://github.com/vllm-project/vllm/pull/10511",
        engine="vllm",
        version="0.6.5.dev (the profiler rewrite)",
        model="meta-llama/Meta-Llama-3-8B",
        kind="GQA",
        shape=LLAMA_3_8B,
        tp=2,
        card_gib=79.22,
        context=8192,
        args=v0_batch(8192),
        weights=7.48,
        non_torch=3.58,
        activation=1.26,
        excluded="as above: the same development build",
    ),
)

# Seen and not held, with why (shown in docs/memory-model.md).
NOT_HELD = (
    (
        "https://github.com/nlzy/vllm-gfx906/issues/10",
        "gemma-3-27b AWQ at TP 2 on MI50 (a ROCm fork without flash attention): activation grows with the "
        "square of the context (2.87 GiB at 4K, 10.32 at 8K). Not the CUDA engine the planner models.",
    ),
    (
        "https://github.com/vllm-project/vllm/issues/15766",
        "gemma-3-27b-it (sliding-window layers) on 8 x T4 with vLLM 0.8.2 (V0): 6.74 GiB of weights, 0.11 "
        "non-torch and 1.66 activation a card, but the stored copy of the thread cuts off the command (TP and "
        "context unknown) and the activation holds the vision encoder's profile, which is not modelled.",
    ),
    (
        "https://github.com/dennislee22/vLLM-benchmarking/blob/0787d88e1a6fc0e37a4eaf3d3e691b36eda25352/log/vllm-120B-4gpuA10080GB-0.8GRAM-diff-nodes.log",
        "gpt-oss-120b (sliding-window layers) with vLLM 0.10.1.1 (V1), TP 4 over four nodes of one A100 80 GB "
        "each: 'Model loading took 17.2217 GiB', 'Available KV cache memory: 45.32 GiB', 'Maximum concurrency "
        "for 16,384 tokens per request: 284.25x'. Its KV figure is held (tests/planning/test_memory_calibration.py: "
        "the sliding layers' allowance gives 45.32 / 284.25 GiB a sequence); its whole need is not: the log "
        "prints no card total, TP across nodes is a layout the planner does not place, and the run uses "
        "FlashInfer's sampler ('Using FlashInfer for top-p & top-k sampling'), which does not sort the logits.",
    ),
    (
        "https://github.com/xlisp/jimw-vllm/blob/67edde203fc2f1dee434619310bd926abcefc7e8/quickstart.py",
        "facebook/opt-125m (MHA) on the same 7.92 GiB card and vLLM 0.6.4.post1 as the phi-1_5 point, logged "
        "twice with the same settings: non_torch_memory 0.15 GiB in one run and 0.43 GiB in the other "
        "(ubuntu2404_560_12_6_vllm.py). On a 0.24 GiB model that noise alone is a third of the need, so "
        "the two runs fall at +23% and -6% of a flat 0.35 GiB; a 10% bound cannot hold a model this small.",
    ),
    (
        "https://github.com/inspektor-gadget/ig-gpu-instructions/blob/741efa793d11c86c07067e6f1a9cbdb9e848e68f/use-cases/vllm-gpu-memory-oom.md",
        "NousResearch/Llama-2-7b-hf (MHA) with vLLM 0.19.0 on an A100 80GB PCIe at 2048 tokens: 'Model loading "
        "took 12.55 GiB', 'Available KV cache memory: 58.37 GiB', 'GPU KV cache size: 119,536 tokens'. Its KV "
        "bytes a token are held (tests/planning/test_memory_calibration.py); its whole need is not: the post prints "
        "no card total, so what the budget kept beside weights and cache cannot be read from it.",
    ),
    (
        "https://github.com/llm-d/llm-d-benchmark/blob/0282dcf693ff0633bce345e1f1f72b27a37e6a79/config_explorer/empirical-vllm-memory-results.md",
        "openai/gpt-oss-120b on one H100 in the same report as the gpt-oss-20b point: its row's figures (64.38 "
        "+ 7.38 + 0.13 + 3.33 GiB) sum to 0.95 x 79.18 GiB, not to the 0.9 its row and the report's setup "
        "give, and the report has no section for the run that would settle which; left out.",
    ),
    (
        "https://myoceane.fr/index.php/ai-vllm-a100-gemma-4/",
        "openai/gpt-oss-20b with vLLM 0.19.0 on an A100 (2026-04-18): 'Model loading took 13.72 GiB', 'Available KV "
        "cache memory: 36.56 GiB' at --gpu-memory-utilization 0.65 and --max-model-len 131072. The stored copy of the "
        "post shows no card total and no 'GPU KV cache size' line, so neither the need nor the KV bytes a token can "
        "be read from it; left out.",
    ),
    (
        "https://github.com/gpustack/runner/pull/251",
        "Qwen3.6-27B AWQ with an MTP drafter at TP 2, vLLM 0.27.1: 'Estimated CUDA graph memory: 0.36 GiB total', "
        "'Available KV cache memory: 6.87 GiB', --gpu-memory-utilization 0.82. A hybrid model (Gated DeltaNet layers "
        "beside attention) with a speculative drafter, neither of which the planner shapes, and no card total; left out.",
    ),
    (
        "https://github.com/noonghunna/club-3090/issues/46",
        "Qwen3.6-27B (autoround int4, a drafter) at TP 2 on two RTX 4090s, vLLM 0.20.1rc1 nightly: 'Available KV cache "
        "memory: 9.74 GiB', 'GPU KV cache size: 67,728 tokens'; the same rigs' reports (#96, #127, #142, #294, #295, "
        "#612; vLLM 0.20 to 0.24) all run hybrid Qwen3.5/3.6 models with MTP or DFlash drafters and FP8 KV caches. "
        "The planner does not shape Gated DeltaNet state or drafters, so none is held.",
    ),
    (
        STORED + "61918553602 (notes of a vLLM set-up on WSL2, 'attempt 4')",
        "Qwen/Qwen2.5-0.5B-Instruct with vLLM 0.27.1 (Model Runner V2) on a 23.99 GiB card, --max-model-len 2048, "
        "--gpu-memory-utilization 0.85: 'Model loading took 0.93 GiB', 'Free memory on device (22.45/23.99 GiB)', "
        "'1.49 GiB for consumed memory (weights + non-torch), 0.25 GiB for peak activation, and 0.37 GiB for "
        "CUDAGraph memory', 'Available KV cache memory: 18.65 GiB', 'GPU KV cache size: 1,629,520 tokens'. Left out: "
        "the engine failed right after (a kernel warm-up error), and on a 0.9 GiB model the planner's flat terms "
        "(1 GiB of graphs, 0.35 GiB outside PyTorch) outweigh the 0.93 GiB logged for them, so a bound in percent "
        "cannot hold it (as opt-125m above); its 0.56 GiB outside PyTorch is WSL2's.",
    ),
    (
        "https://github.com/vllm-project/vllm/pull/12126",
        "Llama-3.2-11B-Vision: 36.63 GiB of activation from profiling the vision encoder; multimodal "
        "encoders are not modelled.",
    ),
)


def terms_of(point: Logged) -> str:
    """The release range of the memory terms that plan ``point`` (engines.toml)."""
    release = re.search(r"\d+\.\d+(?:\.\d+)*", point.version)
    return terms_for(point.engine, release[0] if release else None).memory.version


def table() -> str:
    """The markdown tables of docs/memory-model.md: one a release range of the memory terms, the
    current releases first."""
    header = [
        "| # | model | what | engine | TP | card | context | logged need | planned | error | "
        "weights x 1.2 + 2 | terms logged / planned | source |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    numbered = list(enumerate(POINTS, 1))
    ranges = sorted({terms_of(p) for p in POINTS}, key=lambda v: [terms_of(p) for p in POINTS].index(v))
    current = terms_for("vllm", None).memory.version
    ranges.sort(key=lambda v: (v != current, "0.17" not in v, "0.11" not in v))
    tables = []
    for described in ranges:
        rows = [f"#### {described}", "", *header]
        rows += _rows([(i, p) for i, p in numbered if terms_of(p) == described])
        tables.append("\n".join(rows))
    newer = terms_for("vllm", "0.17").memory.version
    for described in (newer, current):
        if described not in ranges:
            tables.insert(
                0, f"#### {described}\n\nNo logged start-up with a card total was found for this range."
            )
    return "\n\n".join(tables)


def _rows(points: list[tuple[int, Logged]]) -> list[str]:
    rows = []
    for i, point in points:
        c = plan(point)
        beside = c.terms.get("non_torch", 0) + c.terms.get("comm_buffers", 0)
        terms = [
            f"weights {point.weights:.2f}/{c.memory.weights / GIB:.2f}"
            + (" (from the log)" if point.weights_from_log else ""),
        ]
        if point.combined:
            terms.append(
                f"activation and non-torch {point.non_torch:.2f}/{beside + c.terms.get('activation', 0):.2f}"
                " (budget - weights - KV cache)"
            )
        else:
            terms.append(f"activation {point.activation:.2f}/{c.terms.get('activation', 0):.2f}")
            terms.append(f"non-torch {point.non_torch:.2f}/{beside:.2f}")
        if point.kv is not None:
            terms.append(f"KV {point.kv:.2f}/{c.memory.kv / GIB:.2f}")
        else:
            terms.append("KV not logged")
        if point.cuda_graph is not None:
            terms.append(f"graphs {point.cuda_graph:.2f}/{c.terms.get('cuda_graph', 0):.2f}")
        else:
            terms.append("graphs not in the profile")
        error = f"{c.error:+.1%}" + (
            " (not held)" if point.excluded else " (held out)" if point.held_out else ""
        )
        rows.append(
            f"| {i} | {point.model} | {point.kind} | vLLM {point.version} | {point.tp} | {point.card_gib} GiB | "
            f"{point.context} | {point.need:.2f} | {c.planned:.2f} | {error} | {c.rule:.2f} | "
            f"{'; '.join(terms)} | {point.source} |"
        )
    return rows


if __name__ == "__main__":  # pragma: no cover - prints the docs table
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_web.settings")
    django.setup()
    print(table())
