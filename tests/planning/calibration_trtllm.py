"""TensorRT-LLM 1.x start-ups for the calibration (tests/planning/calibration.py): none usable was found, so
this says what was searched and what was read, and why none is held.

A usable point needs, from one start-up of a named 1.x release on a discrete card: the card's total ("device
total memory"), the weights ("Memory used after loading model weights (inside torch)"), the profiled peak
("Peak memory during memory usage profiling (torch + non-torch)") and the KV pool ("Allocated X GiB for max
tokens in paged KV cache"), with the model named.
"""

from __future__ import annotations

STORED = "stored public file, search-index id "

# Seen and not held, with why (shown in docs/memory-model.md).
NOT_HELD_TRTLLM = (
    (
        "https://forums.developer.nvidia.com/t/tensorrt-llm-pytorch-memory-fraction-automatically-limited-to-0-14-"
        "despite-kv-cache-configuration/354807",
        "TensorRT-LLM 1.1.0rc3 (nvcr.io/nvidia/tensorrt-llm/release:spark-single-gpu-dev) serving openai/gpt-oss-20b "
        "with trtllm-serve on a DGX Spark (GB10, unified memory shared with the host): 'max_tokens is set by "
        "kv_cache_config.max_tokens: 4128', 'Allocated 0.19 GiB for max tokens in paged KV cache (4128)'. A "
        "unified-memory device, and a pool pinned by max_tokens rather than the free-memory fraction; left out",
    ),
    (
        "https://github.com/triton-inference-server/tutorials/pull/150",
        "TensorRT-LLM's PyTorch backend under Triton (the speculative decoding guide's log): 'Max KV cache blocks per "
        "sequence: 65 [window size=2051], tokens per block=32, primary blocks=116617', '[MemUsageChange] Allocated "
        "78.30 GiB for max tokens in paged KV cache (3731744)'. The excerpt has no release, card total, weights or "
        "profiling lines, and a drafter model beside the target; left out",
    ),
    (
        "https://github.com/NVIDIA/TensorRT-LLM/pull/15734",
        "TensorRT-LLM's PyTorch backend (a 1.x development build, the multimodal encoder cache PR): 'Allocated "
        "81.90 GiB for max tokens in paged KV cache (536768)', 'Peak memory during memory usage profiling (torch + "
        "non-torch): 69.42 GiB ... device total memory 139.80 GiB, temporary kv cache memory during profiling 20.62 "
        "GiB', with 0.125 GiB reserved for a multimodal encoder cache. The excerpt names no model, no weights line and "
        "no release; a vision model's encoder is not modelled; left out",
    ),
    (
        "https://github.com/NVIDIA/TensorRT-LLM/issues/16827",
        "TensorRT-LLM 1.2.1 (NGC release image) serving Llama-3.3-70B-FP8 on one H200 (143771 MiB): the thread's "
        "excerpts give the environment and benchmark figures, none of the start-up's memory lines; left out",
    ),
    (
        "https://github.com/NVIDIA/TensorRT-LLM/issues/6294",
        "TensorRT-LLM 0.20.0 with nvidia/Llama-3.1-8B-Instruct-FP8 on an H100 ('Rank 0 uses 8.46 GB for model "
        "weights'): a 0.x release, before the 1.x terms; the excerpt stops before the profiling lines",
    ),
    (
        "https://github.com/NVIDIA/TensorRT-LLM/issues/4275",
        "TensorRT-LLM 0.19.0 with RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8 on a 31.84 GiB card: 'Memory usage when "
        "calculating max tokens in paged kv cache: total: 31.84 GiB, available: 17.83 GiB', '[MemUsageChange] "
        "Allocated 16.05 GiB for max tokens in paged KV cache (263008)'. A 0.x release (the 1.x free-memory rule "
        "after the profiled peak is not what it logs); left out",
    ),
)

UNCALIBRATED_TRTLLM = (
    "No logged TensorRT-LLM 1.x start-up on a discrete card with its model, release and every figure of its memory "
    "profile was found. Searched: GitHub issues and pull requests (NVIDIA/TensorRT-LLM and others) for 'TensorRT-LLM "
    "version: 1.', 'Memory used after loading model weights (inside torch)', 'Peak memory during memory usage "
    "profiling (torch + non-torch)', 'Allocated ... GiB for max tokens in paged KV cache' and '[MemUsageChange]'; "
    "public files for the same lines (seven hits: six copies of TensorRT-LLM's own _torch/pyexecutor source that "
    "prints them, and one start-up on a 119.70 GiB unified-memory device without its model or release). The 2.0 GiB "
    "runtime figure is a planning figure, said so in its source; 'Seen and not held' lists the logs read."
)
