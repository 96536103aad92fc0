"""Logged SGLang start-ups held against the planner's SGLang terms (``[sglang.memory]`` of
planning/engines.toml), the table docs/memory-model.md shows for them, and the SGLang logs seen and
not held, with why. tests/planning/calibration.py registers them beside vLLM's points;
tests/planning/test_memory_calibration_sglang.py holds them.

What "logged need" is for SGLang. SGLang sizes its KV pool from a fraction: weights and pool fill
``--mem-fraction-static`` of what was free before the weights loaded
(python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py ``profile_max_num_token``), and
activations, CUDA graphs and the request pool come out of the rest. So the need a start-up logs is its
static need, three terms the log prints on each rank:

- held before the weights: the card's total less "Load weight begin. avail mem=" (or less
  "Load weight end"'s avail mem plus its mem usage, the same figure: SGLang logs their difference);
  the CUDA context, cuBLAS and, at TP > 1, what torch distributed init holds;
- weights: "Load weight end. ... mem usage=";
- KV pool: "KV Cache is allocated. #tokens: N, K size: K GB, V size: V GB", K + V.

The planner's same terms are its SGLang budget (``CardMemory.budget``): ``non_torch`` and
``comm_buffers`` (held before the weights) plus the fraction of the rest, which the weights and the
pool share; the pool is planned as tokens (``kv_tokens``) beside the logged ``#tokens``. What start-up
takes of the reserve ("Memory pool end. avail mem=" below what the pool left, "Capture cuda graph end
... mem usage=") is shown beside the planned ``reserved`` term, not added to the need: the reserve is
sized for activations the start-up log never shows.

SGLang's "GB" is 2**30 bytes: ``get_available_gpu_memory`` returns ``free_gpu_memory / (1 << 30)``
from ``torch.cuda.mem_get_info`` (a stored copy of python/sglang/srt/utils, search-index id
69164614299), so the card's total beside it is the one torch reports (79.18 GiB for an H100 80GB HBM3,
as vLLM's logs of the card print it).

A point counts for a release range only when its log names the release (check_env's "sglang: 0.5.x",
an image tag, a pinned wheel): a source build names none, and is shown, held to the same bound, but not
counted as calibrating any release.
"""

from __future__ import annotations

from dataclasses import dataclass

from planning.engines import terms_for
from planning.memory import card_memory
from planning.types import Shape
from tests.planning.calibration_logged import GIB
from tests.planning.calibration_shapes import QWEN3_14B, shape_from_fixture

STORED = "stored public file, search-index id "


@dataclass(frozen=True)
class SGLangLogged:
    """One SGLang start-up as its log printed it, one rank, in GiB (SGLang's "GB")."""

    source: str
    release: str  # as the log names it ("0.5.4"); blank when it names none (a source build)
    build: str  # what the log says of the build, for the table
    model: str
    kind: str
    shape: Shape
    tp: int
    card: str
    card_gib: float  # the card's total as torch reports it (SGLang logs none)
    card_source: str
    context: int
    fraction: float  # mem_fraction_static as the log gives it
    free_before: float  # avail mem before the weights loaded
    weights: float
    kv: float  # K size + V size
    tokens: int  # "#tokens"
    pool_end: float | None = None  # "Memory pool end. avail mem="
    graphs: float | None = None  # "Capture cuda graph end ... mem usage="
    held_out: bool = False
    notes: str = ""

    @property
    def held_before(self) -> float:
        return self.card_gib - self.free_before

    @property
    def need(self) -> float:
        """The static need: held before the weights + weights + K and V."""
        return self.held_before + self.weights + self.kv


@dataclass(frozen=True)
class SGLangCompared:
    point: SGLangLogged
    planned: float  # the planner's budget, GiB: held before the weights + weights + pool
    held_before: float
    weights: float
    pool: float
    tokens: int
    reserved: float

    @property
    def error(self) -> float:
        return self.planned / self.point.need - 1

    @property
    def tokens_error(self) -> float:
        return self.tokens / self.point.tokens - 1


def plan_sglang(point: SGLangLogged) -> SGLangCompared:
    """The planner's SGLang figures for the point's card, TP, context and fraction, by the terms of
    its release (the current terms when it names none)."""
    eng = terms_for("sglang", point.release or None)
    memory = card_memory(
        eng,
        point.shape,
        point.tp,
        point.context,
        None,
        total=round(point.card_gib * GIB),
        args=("--mem-fraction-static", str(point.fraction)),
    )
    assert memory is not None and memory.budget is not None and memory.kv_tokens is not None
    inside = {t.name: t.bytes / GIB for t in memory.terms if t.inside}
    held = inside.get("non_torch", 0) + inside.get("comm_buffers", 0)
    weights = memory.weights / GIB
    reserved = sum(t.bytes for t in memory.terms if t.name == "reserved") / GIB
    return SGLangCompared(
        point=point,
        planned=memory.budget / GIB,
        held_before=held,
        weights=weights,
        pool=memory.budget / GIB - held - weights,
        tokens=memory.kv_tokens,
        reserved=reserved,
    )


H100_TOTAL = (
    "79.18 GiB, an H100 80GB HBM3 as torch reports it in vLLM's logs of the card (llm-d report, "
    "tests/planning/calibration_current.py)"
)

POINTS: tuple[SGLangLogged, ...] = (
    SGLangLogged(
        source=STORED + "69624180828 (raw data of a CPU MoE offloading report, 2026-08-27: run "
        "20260827_124509_tsk043_smoke_qwen30b, t1_gpu_only/server.log)",
        release="",
        build="source build under /sgl-workspace, release not named",
        model="Qwen/Qwen3-30B-A3B-FP8",
        kind="MoE, quantized",
        shape=shape_from_fixture("Qwen__Qwen3-30B-A3B", round(29.15 * GIB)),  # the log's weights
        tp=1,
        card="H100 80GB HBM3 (its kernel-config lookups name it)",
        card_gib=79.18,
        card_source=H100_TOTAL,
        context=40960,  # context_length=None: the config's 40960
        fraction=0.83,
        free_before=78.48,
        weights=29.15,
        kv=17.99 + 17.99,
        tokens=392_920,
        pool_end=12.70,
        notes="'Load weight begin. avail mem=78.48 GB', 'Load weight end ... mem usage=29.15 GB', 'KV Cache "
        "is allocated. dtype: torch.bfloat16, #tokens: 392920, K size: 17.99 GB, V size: 17.99 GB', 'Memory "
        "pool end. avail mem=12.70 GB'",
    ),
    SGLangLogged(
        source=STORED + "55529353766 (a load-test project's service baseline, 2026-06-14: "
        "logs/server_qwen3_14b_tp4.log)",
        release="",
        build="built from source at commit ebaf86d4, release not named",
        model="Qwen/Qwen3-14B",
        kind="GQA",
        shape=QWEN3_14B,
        tp=4,
        card="RTX 4090 (24564 MiB)",
        card_gib=23.55,
        card_source="23.55 GiB, an RTX 4090 as vLLM's log of the card gives it (vllm-project/vllm#13061)",
        context=40960,
        fraction=0.80,
        free_before=16.00 + 7.08,
        weights=7.08,
        kv=5.69 + 5.69,
        tokens=298_447,
        notes="'Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=16.00 GB, mem "
        "usage=7.08 GB', 'KV Cache is allocated. #tokens: 298447, K size: 5.69 GB, V size: 5.69 GB'",
    ),
)


def named(point: SGLangLogged) -> bool:
    """Whether the point's log names its release, so that it can calibrate a release range."""
    return bool(point.release)


# SGLang logs seen in this search (item 3: SGLang 0.5.x) and not held, with why. The two source
# builds above, and the LoRA notebook, are listed in tests/planning/calibration_current.py's NOT_HELD.
NOT_HELD: tuple[tuple[str, str], ...] = (
    (
        "https://github.com/LMCache/LMCache/issues/2400",
        "Qwen/Qwen3-14B on one card ('CUDA_VISIBLE_DEVICES=6 python -m sglang.launch_server --model-path "
        "Qwen/Qwen3-14B ... --enable-lmcache', 2026-01-14): server_args mem_fraction_static=0.835 (SGLang's "
        "default for an 81559 MiB card at TP 1: (81559 - 13440) / 81559), 'Load weight end ... avail mem=50.99 "
        "GB, mem usage=27.69 GB'. The stored thread names neither the SGLang release nor the card, and its KV "
        "line was not in the parts read; left out.",
    ),
    (
        "https://github.com/sgl-project/sglang/issues/10216",
        "DeepSeek-V3 at TP 16 over two nodes of eight H100 80GB HBM3, lmsysorg/sglang:v0.5.2rc0-cu126 "
        "('sglang: 0.5.2rc0' in check_env; nvidia-smi: 81559 MiB a card): a named 0.5 release, but the stored "
        "thread's parts read hold the environment, nvidia-smi under load and the crash, not the start-up's "
        "memory lines; TP across nodes is also a layout the planner does not place for SGLang's MLA pool.",
    ),
    (
        "https://github.com/sgl-project/sglang/issues/16771",
        "8 x H100 80GB HBM3, 'sglang: 0.5.6.post3.dev975+g4935344fc' (a development build after 0.5.6.post3): "
        "a HiCache (hierarchical cache) crash report; no start-up memory lines in the parts read.",
    ),
    (
        "https://github.com/sgl-project/sglang/issues/37852",
        "8 x H100, 'sglang: 0.5.19.dev658+ga1fe4e30a', DeepSeek-V4-Flash: a development build and a model "
        "whose compressed KV pools the planner does not shape; metrics only, no start-up lines read.",
    ),
    (
        "https://github.com/sgl-project/sglang/issues/6291",
        "Qwen3 (Qwen3ForCausalLM, 'mem usage=15.35 GB') under SGLang 0.4.6 (the title's 'sglang0.4.6'): "
        "'KV Cache is allocated. #tokens: 404890, K size: 27.80 GB, V size: 27.80 GB', 'Memory pool end. avail "
        "mem=7.64 GB', 'Capture cuda graph end ... mem usage=1.39 GB', context_len=8096: a full start-up, "
        "but of 0.4.6, older than the 0.5 terms, with no card total; left out.",
    ),
    (
        "https://github.com/xorbitsai/inference/issues/3481",
        "Qwen3-14B on one card (2025-05-19, an SGLang of the 0.4 series by date; no release printed): 'Load "
        "weight end ... avail mem=19.67 GB, mem usage=27.57 GB', '#tokens: 91749, K size: 7.00 GB, V size: "
        "7.00 GB'; neither the release nor the card is named; left out.",
    ),
    (
        "https://github.com/sgl-project/sglang/pull/11716",
        "eight H200s at TP 8 on a development build (2025-10-16): 'Init torch distributed ends. mem "
        "usage=1.77 GB' to '2.01 GB' (the comm_buffers source), '#tokens: 2795207, K size: 53.31 GB', 'Memory "
        "pool end. avail mem=11.87 GB'; a PR's build, no release, and the model is not named in the parts read.",
    ),
    (
        "https://github.com/sgl-project/sglang/pull/12978",
        "a PR's test run (2025-11-10): 'Capture cuda graph end ... mem usage=1.04 GB. avail mem=11.22 GB' at "
        "TP 2 with piecewise graphs; a development build, no model or card named in the parts read.",
    ),
    (
        "https://github.com/sgl-project/sglang/pull/15909",
        "Qwen-Omni-30B-A3B at TP 4 (2025-12-28): '#tokens: 2090351, K size: 23.92 GB', 'Memory pool end. "
        "avail mem=12.45 GB'; a multimodal model on a PR's build; left out.",
    ),
    (
        "https://github.com/noonghunna/club-3090/issues/1261",
        "two RTX 5090s, a Qwen3.5 hybrid (Gated DeltaNet) NVFP4 model with a drafter and two KV pools "
        "('#tokens: 454112, K size: 3.46 GB' and '1.08 GB'): hybrid state and drafters are not shaped here.",
    ),
    (
        "https://github.com/kvcache-ai/ktransformers/issues/1870",
        "Qwen3.5 MoE (hybrid, 'Mamba Cache is allocated') on RTX 4090s with CPU experts: not shaped here.",
    ),
    (
        "https://github.com/opendatalab/MinerU/issues/3375",
        "MinerU's own vision-language model (Mineru2QwenForCausalLM), 2025-08-26; crashed in graph capture; "
        "a model the planner does not shape, release not named.",
    ),
    (
        STORED + "49361099215 (a README's expected start-up, 2025-07-14)",
        "Llama-3.1-8B in the SGLang Docker image on a 24 GB card: 'mem usage=15.02 GB', '#tokens: 38141', "
        "'Capture cuda graph end ... mem usage=0.11 GB'; the image's tag and the card are not named (July 2025 "
        "is before 0.5); left out.",
    ),
    (
        STORED + "46857556603, 56671970114, 54618842866 (start-ups of Granite 4 and Qwen3.5 models)",
        "hybrid (Mamba / Gated DeltaNet) models: their state pools are not shaped here.",
    ),
    (
        STORED + "1272019175, 69412325477 (Kimi-K2.5 at TP 8, DeepSeek-V4 with a DSpark drafter)",
        "MLA and compressed-KV models at scale on unnamed builds; left out.",
    ),
    (
        STORED + "53259568910 (a documentation notebook as executed, 2026-02-04)",
        "Qwen2.5-0.5B-Instruct with a pinned pool ('#tokens: 20480' with 77 GB free): not sized by the "
        "fraction; left out.",
    ),
)

UNCALIBRATED = (
    f"No logged SGLang 0.5 start-up with its release, model and card's total was found: {len(POINTS)} "
    "start-ups with every figure of the static need are shown below, both source builds that name no release, "
    "so they hold no release range (0 named-release points, none held out); the named-release 0.5 logs seen "
    "(0.5.2rc0, 0.5.6.post3.dev, 0.5.19.dev) print no start-up memory lines in the parts read, and the rest "
    "run hybrid or multimodal models or name no release ('Seen and not held'). Both start-ups shown hold the "
    "terms within 5% and never under, the pool taken as the fraction of what was free before the weights "
    "loaded (model_runner_kv_cache_mixin.py); the default fraction rests on server_args.py, and the 2.0 GiB "
    "held at TP > 1 on cards of 70 GiB or more on logs without a pool to check it."
)


def table() -> str:
    """The SGLang table of docs/memory-model.md."""
    rows = [
        "| # | model | what | build | TP | card | context | fraction | logged need | planned | error | "
        "tokens logged / planned | terms logged / planned | beside the pool, logged / reserve planned | source |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, point in enumerate(POINTS, 1):
        c = plan_sglang(point)
        terms = (
            f"held before the weights {point.held_before:.2f}/{c.held_before:.2f}; weights "
            f"{point.weights:.2f}/{c.weights:.2f}; KV pool {point.kv:.2f}/{c.pool:.2f}"
        )
        beside = []
        if point.pool_end is not None:
            beside.append(
                f"rest of the pool {point.free_before - point.weights - point.kv - point.pool_end:.2f}"
            )
        if point.graphs is not None:
            beside.append(f"graphs {point.graphs:.2f}")
        logged_beside = ", ".join(beside) if beside else "not logged"
        status = "" if named(point) else " (release not named: not counted)"
        rows.append(
            f"| {i} | {point.model} | {point.kind} | {point.build} | {point.tp} | {point.card_gib} GiB | "
            f"{point.context} | {point.fraction:g} | {point.need:.2f} | {c.planned:.2f} | {c.error:+.1%}{status} | "
            f"{point.tokens:,} / {c.tokens:,} ({c.tokens_error:+.1%}) | {terms} | {logged_beside} / "
            f"{c.reserved:.2f} | {point.source} |"
        )
    return "\n".join(rows)
