"""Logged engine start-ups the memory model is held to (tests/test_memory_calibration.py)
and the table docs/memory-model.md shows (``python -m tests.calibration`` prints it).

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

from dataclasses import dataclass, field

from catalog.planning.engines import engine
from catalog.planning.memory import card_memory
from catalog.planning.types import CardMemory, Shape

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
    memory = card_memory(
        engine(point.engine),
        point.shape,
        point.tp,
        point.context,
        None,
        total=round(point.card_gib * GIB),
        args=args,
    )
    assert memory is not None
    terms = {t.name: t.bytes / GIB for t in memory.terms if t.inside}
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
        "https://github.com/vllm-project/vllm/pull/12126",
        "Llama-3.2-11B-Vision: 36.63 GiB of activation from profiling the vision encoder; multimodal "
        "encoders are not modelled.",
    ),
)


def table() -> str:
    """The markdown table of docs/memory-model.md."""
    rows = [
        "| # | model | what | engine | TP | card | context | logged need | planned | error | "
        "weights x 1.2 + 2 | terms logged / planned | source |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, point in enumerate(POINTS, 1):
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
        error = f"{c.error:+.1%}" + (" (not held)" if point.excluded else "")
        rows.append(
            f"| {i} | {point.model} | {point.kind} | vLLM {point.version} | {point.tp} | {point.card_gib} GiB | "
            f"{point.context} | {point.need:.2f} | {c.planned:.2f} | {error} | {c.rule:.2f} | "
            f"{'; '.join(terms)} | {point.source} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover - prints the docs table
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_web.settings")
    django.setup()
    print(table())
