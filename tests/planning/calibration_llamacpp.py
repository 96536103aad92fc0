"""Logged llama.cpp start-ups the llama.cpp memory terms are held to (tests/planning/calibration.py), and
the llama.cpp logs seen and not held, with why.

A llama.cpp start-up prints three buffers per card, which are its whole need there, as its own fit
reckons it ('llama_params_fit_impl: projected to use ... MiB of device memory'; the breakdown's
'self = model + context + compute'): the weights ('load_tensors: CUDA0 model buffer size'), the KV
cache ('llama_kv_cache: CUDA0 KV buffer size', the n_ctx cells at once) and the compute buffer
('llama_context:' or 'sched_reserve: CUDA0 compute buffer size'). Here they are ``weights``, ``kv``
and ``activation`` (GiB as logged), nothing else: the CUDA context and cuBLAS workspace are not in
the log, left to --fit-target's margin. Each model's shape is its log's print_info (or its GGUF
metadata dump): n_layer, n_head, n_head_kv, n_embd_head_k, n_embd, n_ff, n_vocab. The weights are
the log's (the token embedding stays in host memory, which the planner's GGUF-size term does not
take off), so what these points hold is the KV cache and the compute buffer.
"""

from __future__ import annotations

from planning.types import Shape
from tests.planning.calibration_logged import GIB, Logged

STORED = "stored public file, search-index id "
MIB = 2**20


def _gib(mib: float) -> float:
    return mib * MIB / GIB


def _shape(
    *,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    hidden: int,
    ffn: int,
    vocab: int,
    weights_mib: float,
) -> Shape:
    return Shape(
        layers=layers,
        attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        attention="mha" if heads == kv_heads else "gqa",
        kv_bytes_per_token=2 * layers * kv_heads * head_dim * 2,
        weight_bytes=round(weights_mib * MIB),
        hidden_size=hidden,
        intermediate_size=ffn,
        vocab_size=vocab,
    )


# print_info: n_layer 61, n_head 48, n_head_kv 2, n_embd_head_k 128, n_embd 6144, n_ff 23040, n_vocab 151552
GLM_Z1_32B = _shape(
    layers=61, heads=48, kv_heads=2, head_dim=128, hidden=6144, ffn=23040, vocab=151552, weights_mib=16303.48
)
# GGUF metadata and print_info: 28 layers, 28 heads, 4 KV heads of 128, n_embd 3584, n_ff 18944, n_vocab 152064
QWEN2_5_CODER_7B = _shape(
    layers=28, heads=28, kv_heads=4, head_dim=128, hidden=3584, ffn=18944, vocab=152064, weights_mib=4168.09
)
# print_info: 32 layers, 32 heads and 32 KV heads of 96 (MHA), n_embd 3072, n_ff 8192, n_vocab 32064
PHI_3_MINI = _shape(
    layers=32, heads=32, kv_heads=32, head_dim=96, hidden=3072, ffn=8192, vocab=32064, weights_mib=2228.82
)
# Qwen/Qwen3-1.7B config.json: 28 layers, 16 heads, 8 KV heads of 128, hidden 2048, intermediate 6144, vocab 151936
QWEN3_1_7B = _shape(
    layers=28, heads=16, kv_heads=8, head_dim=128, hidden=2048, ffn=6144, vocab=151936, weights_mib=1050
)
# Qwen/Qwen3-4B config.json: 36 layers, 32 heads, 8 KV heads of 128, hidden 2560, intermediate 9728, vocab 151936
QWEN3_4B = _shape(
    layers=36, heads=32, kv_heads=8, head_dim=128, hidden=2560, ffn=9728, vocab=151936, weights_mib=2375.91
)

# meta-llama/Llama-3.2-3B config.json: 28 layers, 24 heads, 8 KV heads of 128, hidden 3072, intermediate 8192,
# vocab 128256 (embeddings tied: llama.cpp copies the output matrix onto the card)
LLAMA_3_2_3B = _shape(
    layers=28, heads=24, kv_heads=8, head_dim=128, hidden=3072, ffn=8192, vocab=128256, weights_mib=1918.36
)

GLM_SOURCE = (
    STORED + "17356702205 (an archived copy of https://github.com/ikawrakow/ik_llama.cpp/pull/370, "
    "ubergarm's comment of 2025-05-03, the llama.cpp/master@36667c8e run)"
)

LLAMACPP: tuple[Logged, ...] = (
    Logged(
        source=GLM_SOURCE,
        engine="llamacpp",
        version="b5274 ('build: 5274 (d541533a)', llama-sweep-bench on master 36667c8e)",
        model="THUDM/GLM-Z1-32B-0414 (bartowski IQ4_XS GGUF, 16.38 GiB file)",
        kind="GQA, quantized",
        shape=GLM_Z1_32B,
        tp=1,
        card_gib=23.99,
        card="RTX 3090 Ti",
        context=32768,
        args=("--flash-attn", "on"),
        weights=_gib(16303.48),
        non_torch=0.0,
        activation=_gib(353.00),
        kv=_gib(1952.00),
        weights_from_log=True,
        notes="-fa -ctk f16 -ctv f16 -c 32768 -ngl 99 on one RTX 3090 Ti ('Device 0: NVIDIA GeForce RTX 3090 Ti'); "
        "n_ubatch 512, flash_attn 1; 'CUDA0 model buffer size = 16303.48 MiB', 'CUDA0 KV buffer size = 1952.00 MiB', "
        "'CUDA0 compute buffer size = 353.00 MiB'",
    ),
    Logged(
        source=STORED + "56818628539 (an ollama server log of 2026-05-05 in a project's notes)",
        engine="llamacpp",
        version="as ollama vendored it in May 2026 (its build not printed; 'Flash Attention was auto, set to enabled')",
        model="Qwen/Qwen2.5-Coder-7B-Instruct (Q4_K_M GGUF, 4.36 GiB file)",
        kind="GQA, quantized",
        shape=QWEN2_5_CODER_7B,
        tp=1,
        card_gib=12.0,
        card="RTX 3060",
        context=4096,
        args=(),
        weights=_gib(4168.09),
        non_torch=0.0,
        activation=_gib(304.00),
        kv=_gib(224.00),
        weights_from_log=True,
        notes="ollama's runner on one RTX 3060 ('total: 12884901888'), 29/29 layers, n_ctx 4096, n_ubatch 512, flash "
        "attention auto -> enabled: 'CUDA0 model buffer size = 4168.09 MiB', 'CUDA0 KV buffer size = 224.00 MiB', "
        "'CUDA0 compute buffer size = 304.00 MiB' (logits 297.00 + one 3584-wide row a token 7.00)",
    ),
    Logged(
        source=STORED + "68635202314 (a text-generation-webui session's notes: its llama-server start-up)",
        engine="llamacpp",
        version="at commit b548c7c ('build: 1 (b548c7c)', text-generation-webui's build, mid 2025: "
        "llama_kv_cache_unified)",
        model="microsoft/Phi-3-mini-4k-instruct (Q4_K_M GGUF, 2.23 GiB file)",
        kind="MHA, quantized, flash attention off",
        shape=PHI_3_MINI,
        tp=1,
        card_gib=8.0,
        card="RTX 3070",
        context=4096,
        args=("--ubatch-size", "256", "--flash-attn", "off"),
        weights=_gib(2228.82),
        non_torch=0.0,
        activation=_gib(150.00),
        kv=_gib(1536.00),
        weights_from_log=True,
        notes="one RTX 3070 (8 GB), gpu_layers 33, ctx 4096, n_batch = n_ubatch = 256, flash_attn 0: "
        "'CUDA0 model buffer size = 2228.82 MiB', 'CUDA0 KV buffer size = 1536.00 MiB', "
        "'CUDA0 compute buffer size = 150.00 MiB' (the 32 heads' KQ scores, 128 MiB, the most of it)",
    ),
    Logged(
        source=STORED
        + "65995731123 (notes of a llama.cpp set-up on WSL2, 2026-03-06: llama-cli's exit breakdown)",
        engine="llamacpp",
        version="b8211 ('version: 8211 (a0ed91a44)', 'build : b8211-a0ed91a44')",
        model="Qwen/Qwen3-1.7B (Q4_K_M GGUF quantized by the author, 1282439488 bytes)",
        kind="GQA, quantized",
        shape=QWEN3_1_7B,
        tp=1,
        card_gib=11.99,
        card="RTX 4080 Laptop GPU",
        context=40960,
        args=(),
        weights=_gib(1050),
        non_torch=0.0,
        activation=_gib(300),
        kv=_gib(4480),
        weights_from_log=True,
        notes="llama-cli -ngl 999 with no -c (the model's 40960 tokens); 'llama_memory_breakdown_print: | - CUDA0 "
        "(RTX 4080 Laptop GPU) | 12281 = 5181 + (5831 = 1050 + 4480 + 300) + 1269 |' (model, context, compute in "
        "whole MiB): 4480 MiB is 40960 cells x 112 KiB",
    ),
    Logged(
        source=STORED + "71453436919 (a project's day-1 evidence notes, 2026-10-08: load_gpu_evidence.log)",
        engine="llamacpp",
        version="built in October 2026 or before (sched_reserve lines; no build number printed in the notes)",
        model="Qwen/Qwen3-4B (Q4_K_M GGUF)",
        kind="GQA, quantized, logits for the server's slots only",
        shape=QWEN3_4B,
        tp=1,
        card_gib=0.0,
        card="not named",
        context=8192,
        args=(),
        weights=_gib(2375.91),
        non_torch=0.0,
        activation=_gib(85.01),
        kv=_gib(1152.00),
        weights_from_log=True,
        held_out=True,
        notes="llama-server -ngl 99 -c 8192: 'CUDA0 model buffer size = 2375.91 MiB', 'CUDA0 KV buffer size = "
        "1152.00 MiB', 'sched_reserve: CUDA0 compute buffer size = 85.01 MiB', 'CUDA_Host output buffer size = "
        "2.32 MiB' (4 outputs of 151936 fp32 logits: the server's slots, ggml-org/llama.cpp#23861); held out: the "
        "planner reserves the whole ubatch's logits for every build",
    ),
    Logged(
        source=STORED
        + "54573746480 (a C# log parser's comment: 'verbatim from the spike's captured output, real "
        "Llama-3.2-3B-Q4_K_M load')",
        engine="llamacpp",
        version="built in 2026 or before (sched_reserve lines, logits for the whole ubatch; no build printed)",
        model="meta-llama/Llama-3.2-3B-Instruct (Q4_K_M GGUF)",
        kind="GQA, quantized",
        shape=LLAMA_3_2_3B,
        tp=1,
        card_gib=0.0,
        card="not named",
        context=2048,
        args=(),
        weights=_gib(1918.36),
        non_torch=0.0,
        activation=_gib(284.90),
        kv=_gib(224.00),
        weights_from_log=True,
        held_out=True,
        notes="'CUDA0 model buffer size = 1918.36 MiB', 'CUDA0 KV buffer size = 224.00 MiB', 'sched_reserve: "
        "CUDA0 compute buffer size = 284.90 MiB'; the context is not in the excerpt: 224 MiB is 2048 cells of "
        "28 layers x 8 KV heads x 128 in f16 (no quantized cache type gives a whole number of 256-cell blocks); "
        "held out: its output phase holds 34.4 MiB beside the 250.5 MiB of logits, more than the planned 28 MiB",
    ),
)

# Seen and not held, with why (shown in docs/memory-model.md).
NOT_HELD_LLAMACPP = (
    (
        STORED + "42478301544 (jina-embeddings-v4 GGUF's README)",
        "llama.cpp serving an embedding model (--embedding --pooling mean, -ub 4096) on a compute capability 8.9 "
        "card with a customized build: 'CUDA0 compute buffer size = 2470.16 MiB'. An embedding graph (no logits "
        "at all) from a modified build; left out",
    ),
    (
        STORED + "45203302072 (a Jetson Orin's notes), " + STORED + "15173380256 (an ollama set-up on WSL)",
        "ollama's llama.cpp with Llama-3.2 3B and 1B: 'CUDA0 compute buffer size = 256.50 MiB' and '254.50 MiB', "
        "each the 128256 logits of 512 tokens and one hidden row a token, as the planner's output phase has it; "
        "no model buffer or context in the excerpts, and the Jetson's memory is unified; left out",
    ),
    (
        STORED + "33339429657 (notes on Qwen3-Coder-Next GGUFs on an RTX 5090)",
        "llama.cpp's exit breakdown at -c 4096 and -c 100096 ('self 29365 = model 28609 + context 397 + compute "
        "358'): a hybrid model (Gated DeltaNet layers beside attention, a mixture of experts), whose recurrent "
        "state the planner does not shape; left out",
    ),
    (
        STORED + "227877646 (a fit-params tool's notes, RTX 4090)",
        "Qwen3-30B-A3B in f16 with '--fit' ('projected to use 19187 MiB of device memory vs. 24077 MiB', "
        "'self 19187 = model 17904 + context 384 + compute 898'): a mixture of experts, its experts either partly "
        "in host memory or its file not f16 (17.5 GiB on the card); its arguments are elided ('[...]'), so its "
        "ubatch is not known (its 384 MiB cache is 4096 cells), and its 898 MiB compute buffer is a mixture of "
        "experts' the planner does not model apart; left out",
    ),
)
