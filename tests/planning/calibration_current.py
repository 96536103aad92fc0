"""Logged start-ups of the current releases (vLLM 0.11 and later), each planned by the terms of its
own release range, and the logs seen and not held, with why (tests/planning/calibration.py)."""

from __future__ import annotations

from tests.planning.calibration_logged import Logged
from tests.planning.calibration_shapes import (
    GPT_OSS_20B,
    LLAMA_3_3_70B_FP8,
    LLAMA_3_8B,
    QWEN3_0_6B,
    QWEN3_32B,
    QWEN3_235B_A22B_FP8,
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

CURRENT: tuple[Logged, ...] = (
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
        card="H100 80 GB",
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
        card="H100 80 GB",
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
        card="H100 80 GB",
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
        card="H100 80 GB",
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
        card="H100 80 GB",
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
        card="H100 80 GB",
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
        card="A100 80GB",
        context=131072,
        # `--model meta-llama/Llama-3.1-8B-Instruct` and nothing else: the release's defaults, its 'Desired
        # GPU memory utilization is (0.92, 72.91 GiB)' among them; planned as an A100, which the 0.21-and-later
        # terms give the large-card defaults (8192 batch tokens, 1024 sequences): the logged peak bears them out
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
        "reaches it, so the 0.21-and-later terms plan an A100 with the large-card defaults (engines.toml, "
        "sources.activation; the copies of vLLM's get_batch_defaults read there keep an A100 at 256, release not pinned)",
    ),
    Logged(
        source=STORED
        + "57976227484: 'Running a big LLM across multiple GPUs with vLLM' (S. Katara, S. Pathak; "
        "datePublished 2026-08-18), Step 5's command and log",
        engine="vllm",
        version="0.27.1 (the post: 'vLLM 0.27.1 running in the official container'; V1, CUDA graphs profiled "
        "inside the budget)",
        model="Qwen/Qwen3-235B-A22B-Instruct-2507-FP8",
        kind="MoE, quantized",
        shape=QWEN3_235B_A22B_FP8,
        tp=4,
        card_gib=95.01,  # 'Free memory on device (94.05/95.01 GiB) on startup'
        card="RTX PRO 6000 Blackwell Server Edition",
        context=32768,
        # `vllm serve ... --tensor-parallel-size 4 --gpu-memory-utilization 0.90 --max-model-len 32768
        # --max-num-seqs 32`; a 95 GiB card that is no A100 takes the large batch default (8192 tokens)
        args=("--gpu-memory-utilization", "0.90", "--max-num-seqs", "32"),
        weights=55.19,
        non_torch=56.89 - 55.19,  # 'Actual usage is 56.89 GiB for consumed memory (weights + non-torch)'
        activation=0.76,
        kv=27.85 / 18.96,
        cuda_graph=0.32,
        weights_from_log=True,
        notes="4 x RTX PRO 6000 Blackwell Server Edition over PCIe (no NVLink: 'SYS' between every pair), driver "
        "610.43.02, CUDA 13.0, VLLM_USE_DEEP_GEMM=0; every rank logs 'Desired GPU memory utilization is (0.9, "
        "85.51 GiB). Actual usage is 56.89 GiB for consumed memory (weights + non-torch), 0.76 GiB for peak "
        "activation, and 0.32 GiB for CUDAGraph memory ... Current kv cache memory in use is 27.85 GiB'; "
        "'Model loading took 55.19 GiB'; 'GPU KV cache size: 621,392 tokens', 'Maximum concurrency for 32,768 "
        "tokens per request: 18.96x'; kept out of the fit: the 0.21-and-later terms were set before it was "
        "found and are unchanged by it",
        held_out=True,
    ),
    Logged(
        source=STORED
        + "62458215816: notes of a retrieval project's set-up ('Starting vLLM locally', 2026-04-03), "
        "the third `docker run` of vllm/vllm-openai:latest",
        engine="vllm",
        version="0.19.0 (the banner's 'version 0.19.0'; V1, CUDA graphs off: --enforce-eager)",
        model="Qwen/Qwen3-0.6B",
        kind="GQA, large vocabulary",
        shape=QWEN3_0_6B,
        tp=1,
        # the same card's first start-up: 'Free memory on device cuda:0 (9.02/11.63 GiB) on startup is less than
        # desired GPU memory utilization (0.9, 10.47 GiB)'
        card_gib=11.63,
        context=4096,
        args=(
            "--gpu-memory-utilization",
            "0.60",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "1024",
            "--enforce-eager",
        ),
        weights=1.12,
        # 11.63 x 0.60 - 1.12 (Model loading took) - 5.68 (Available KV cache memory)
        non_torch=11.63 * 0.60 - 1.12 - 5.68,
        activation=0.0,
        combined=True,
        kv=5.68 / 12.98,
        weights_from_log=True,
        held_out=True,
        notes="GeForce RTX 3060 12GB on a desktop (the first start-up found 2.6 GiB of it held by other processes); 'Model loading took "
        "1.12 GiB memory', 'Available KV cache memory: 5.68 GiB', 'GPU KV cache size: 53,184 tokens', 'Maximum "
        "concurrency for 4,096 tokens per request: 12.98x'. Kept out of the fit: the 0.17-to-0.20 terms come from "
        "vLLM's source and were not set from it; one small model on a shared desktop card cannot calibrate them",
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
        "be read from it; left out. Were the card the 80 GB A100 (the post's Gemma-4 run holds 48.5 GiB of weights "
        "and 21.5 of cache at 0.9, so it is no 40 GB card) at the 79.25 GiB the 0.31.0 point logs, weights, "
        "activation and non-torch memory would be 0.65 x 79.25 - 36.56 = 14.95 GiB, which the 0.17-to-0.20 terms "
        "plan 2.4% under with vLLM's A100 defaults (256 sequences) and 13% over with the large ones: a borrowed "
        "total cannot hold a bound of 5%.",
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
    (
        STORED + "54810965301 (a console capture of `vllm serve /models/Qwen/Qwen3-8B-AWQ ... "
        "--tensor-parallel-size 2 --max-model-len 32768 --gpu-memory-utilization 0.2`)",
        "Qwen/Qwen3-8B-AWQ with vLLM 0.17.0 ('Initializing a V1 LLM engine (v0.17.0)') at TP 2 on two compute "
        "capability 8.9 cards without P2P: 'Model loading took 2.85 GiB', 'Available KV cache memory: 4.89 GiB', "
        "'GPU KV cache size: 71,152 tokens', 'Maximum concurrency for 32,768 tokens per request: 2.17x', "
        "'Graph capturing finished in 18 secs, took 1.65 GiB'. The cards are not named and 0.17 prints no card "
        "total at INFO, so what the 0.2 budget kept beside weights and cache cannot be read; left out. Its KV "
        "bytes a token (4.89 GiB over 71,152 tokens: 72 KiB, 36 layers x 4 of Qwen3-8B's 8 KV heads of 128 a card) "
        "are the shape's.",
    ),
    (
        STORED + "69624180828 (raw data of a CPU MoE offloading report, 2026-08-27: run "
        "20260827_124509_tsk043_smoke_qwen30b, t1_gpu_only/server.log)",
        "SGLang serving Qwen/Qwen3-30B-A3B-FP8 at TP 1 on one H100 80GB HBM3 (its kernel-config lookups name the "
        "card), mem_fraction_static=0.83, context_length=None (the config's 40960): 'Load weight begin. avail "
        "mem=78.48 GB', 'Load weight end ... mem usage=29.15 GB', 'KV Cache is allocated. dtype: torch.bfloat16, "
        "#tokens: 392920, K size: 17.99 GB, V size: 17.99 GB', 'Memory pool end. avail mem=12.70 GB'. Its KV bytes "
        "a token are held (tests/planning/test_memory_calibration.py). Its pool is what was free after the weights "
        "less the reserve taken from the total (49.33 - 79.18 x 0.17 = 35.87 GiB against 35.98 logged, with an H100's "
        "79.18 GiB as the llm-d report logs it), so the "
        "0.70 GiB held before the weights loaded (79.18 - 78.48) is outside the fraction, as SGLang's source has it "
        "(profile_max_num_token takes the fraction of what init_torch_distributed found free): the planner's pool, "
        "now (total - 0.70) x 0.83 - weights, is 393,089 tokens against the logged 392,920 (+0.04%; it was "
        "total x 0.83 - weights, 1.7% over), held by a unit test (tests/planning/test_memory_calibration.py). Not "
        "in the table: the log prints no SGLang release (a source build under /sgl-workspace), so the release "
        "range it would check cannot be named.",
    ),
    (
        STORED
        + "55529353766 (a load-test project's service baseline, 2026-06-14: logs/server_qwen3_14b_tp4.log)",
        "SGLang built from source at commit ebaf86d4 serving Qwen/Qwen3-14B at TP 4 on four RTX 4090s (24564 MiB "
        "each), --mem-fraction-static 0.80: 'Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail "
        "mem=16.00 GB, mem usage=7.08 GB', 'KV Cache is allocated. #tokens: 298447, K size: 5.69 GB, V size: 5.69 "
        "GB'. What was free before the weights, 16.00 + 7.08 = 23.08 GiB, times 0.80 less the weights is 11.38 GiB, "
        "the logged K and V: the fraction is of what was free then. With an RTX 4090's 23.55 GiB (vLLM's log of "
        "the card, vllm-project/vllm#13061) the card held 0.47 GiB before the weights at TP 4, torch distributed "
        "init included; the planner's 0.70 plans 293,601 tokens (-1.6%) and the static need +0.3%, held by a unit "
        "test (tests/planning/test_memory_calibration.py). Not in the table: a source build, its release not "
        "named.",
    ),
    (
        STORED + "14968382678 (SGLang's LoRA documentation notebook as executed, 2026-02-09)",
        "SGLang serving meta-llama/Meta-Llama-3.1-8B-Instruct with LoRA adapters: 'Load weight begin. avail "
        "mem=78.43 GB', 'Load weight end ... mem usage=15.02 GB', 'KV Cache is allocated. #tokens: 20480, K size: "
        "1.25 GB, V size: 1.25 GB', 'Memory pool end. avail mem=58.18 GB'. A pool of 20480 tokens with 58 GB left "
        "free was not sized by the fraction, and LoRA buffers sit beside it; left out.",
    ),
    (
        STORED + "2263047771 (a TensorRT-LLM start-up, 2025-12-20)",
        "TensorRT-LLM's PyTorch backend on a 119.70 GiB device ('device total memory 119.70 GiB'): 'Memory used "
        "after loading model weights (inside torch) ... 63.52 GiB', '(outside torch) ... 49.78 GiB', 'Peak memory "
        "during memory usage profiling (torch + non-torch): 113.65 GiB, available KV cache memory when calculating "
        "max tokens: 5.95 GiB, fraction is set 0.8999999761581421'. 119.70 GiB is no discrete card's size (a "
        "GB10's unified memory, which the host shares, is), so the 49.78 GiB outside torch cannot be read as the "
        "engine's own, and the excerpt names neither the model nor the release; left out. No TensorRT-LLM 1.x start-up "
        "on a discrete card with its model and release was found.",
    ),
    (
        STORED + "54817645161 (notes on a llama-server with Qwen3-9B on a 16 GB RTX 5060 Ti)",
        "llama.cpp: 'CUDA0 model buffer size = 4861.28 MiB', 'CUDA0 KV buffer size = 2048.00 MiB', 'CUDA0 compute "
        "buffer = 493.00 MiB', 'CUDA0 RS buffer = 50.25 MiB', 'llama_params_fit_impl: projected ... 7452 MiB used "
        "vs. 15106 MiB free'. A hybrid model (8 of 40 layers attention, the rest recurrent), which the planner does "
        "not shape, and no build number; left out.",
    ),
    (
        STORED + "32713047379 (a llama-server start-up, build 8164)",
        "llama.cpp fitting itself to the device ('fitting params to device memory') with "
        "ggml-org/gpt-oss-20b-GGUF: 'llama_params_fit_impl: projected to use 14459 MiB of device memory vs. 18185 MiB of free device memory ... will leave 3726 >= 1024 MiB of free "
        "device memory, no changes needed'. On an Apple M5 (Metal), not a CUDA card; left out.",
    ),
    (
        STORED + "62458215816 (the same notes' second start-up)",
        "Qwen/Qwen3-0.6B with vLLM 0.19.0 on the same 11.63 GiB RTX 3060 at --gpu-memory-utilization 0.75, "
        "--max-model-len 8192, --enforce-eager: 'Model loading took 1.12 GiB memory', 'Available KV cache memory: "
        "8.03 GiB', 'GPU KV cache size: 75,152 tokens', then an error in _dummy_sampler_run. Its budget less its "
        "cache, 0.75 x 11.63 - 8.03 = 0.69 GiB, is below the weights alone: memory other processes released between "
        "vLLM's first memory snapshot and its profile (a 708-second download ran between them) came out as negative "
        "non-torch memory; left out.",
    ),
)


# Engines whose current memory terms no logged start-up holds, with why (the docs' table says so beside the
# engine's terms; test_memory_calibration.py checks that each of the engines is held or listed).
UNCALIBRATED = {
    "sglang": "No logged SGLang 0.5 start-up with its release, model and card's total was found: the two logs read "
    "with every figure of the pool (Qwen3-30B-A3B-FP8 on an H100 at TP 1, Qwen3-14B on four RTX 4090s at TP 4, "
    "under 'Seen and not held') are source builds that name no release. Unit tests hold the pool against both "
    "(+0.04% and -1.6% tokens, the static need +0.0% and +0.3%), taken as the fraction of what was free before "
    "the weights loaded (model_runner_kv_cache_mixin.py); the default fraction rests on server_args.py, and the "
    "2.0 GiB held at TP > 1 on cards of 70 GiB or more on logs without a pool to check it.",
    "trtllm": "No logged TensorRT-LLM 1.x start-up on a discrete card with its model and release was found; the "
    "one read is a unified-memory device's. The runtime figure is a planning figure, said so in its source.",
    "llamacpp": "No llama.cpp start-up of a model the planner shapes on a CUDA card was found: the ones read run "
    "a hybrid recurrent model or Apple's Metal. The runtime figure is a planning figure, said so in its source.",
}
