"""What an engine says about its memory at start-up, read from its log.

vLLM and SGLang print, per card, the figures of their start-up profile; the
agent reads them from the replica's log so the control plane can set what
each card really holds beside what it planned. The lines, as the engines
print them (figures in GiB: both engines divide by 2**30, though some lines
say "GB"):

vLLM V0 (``vllm/worker/worker.py``, ``model_runner.py``, 0.6 to 0.8)::

    Loading model weights took 14.9888 GB
    the current vLLM instance can use total_gpu_memory (23.58GiB) x gpu_memory_utilization (0.90) = 21.19GiB
    model weights take 14.99GiB; non_torch_memory takes 0.35GiB; PyTorch activation peak memory takes
        2.07GiB; the rest of the memory reserved for KV Cache is 3.81GiB.
    Maximum concurrency for 20000 tokens per request: 1.56x
    Graph capturing finished in 31 secs, took 0.64 GiB

vLLM V1 (``vllm/v1/worker/gpu_model_runner.py``, ``gpu_worker.py``, ``v1/core/kv_cache_utils.py``)::

    Model loading took 14.9889 GiB and 3.652170 seconds
    Available KV cache memory: 41.98 GiB
    GPU KV cache size: 171,904 tokens
    Maximum concurrency for 32,768 tokens per request: 5.25x
    Graph capturing finished in 2 secs, took 0.11 GiB

SGLang (``python/sglang/srt/model_executor/model_runner.py``, ``cuda_graph_runner.py``)::

    Load weight end. type=Qwen3MoeForCausalLM, dtype=torch.bfloat16, avail mem=230.20 GB, mem usage=56.98 GB.
    KV Cache is allocated. #tokens: 1669816, K size: 76.44 GB, V size: 76.44 GB
    Capture cuda graph end. Time elapsed: 19.50 s. mem usage=6.19 GB. avail mem=5.24 GB.

Standard library only, like the rest of the agent.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_NUM = r"(-?[0-9][0-9,]*(?:\.[0-9]+)?)"

# (field, pattern, groups → fields); the last match in the log wins (a restart of the engine).
_PATTERNS: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = (
    (re.compile(rf"Loading model weights took {_NUM} ?G(?:i)?B"), ("weights",)),
    (re.compile(rf"Model loading took {_NUM} ?GiB"), ("weights",)),
    (
        re.compile(rf"total_gpu_memory \({_NUM} ?GiB\) x gpu_memory_utilization \({_NUM}\) = {_NUM} ?GiB"),
        ("total", "fraction", "budget"),
    ),
    (
        re.compile(
            rf"model weights take {_NUM} ?GiB; non_torch_memory takes {_NUM} ?GiB; "
            rf"PyTorch activation peak memory takes {_NUM} ?GiB; "
            rf"the rest of the memory reserved for KV Cache is {_NUM} ?GiB"
        ),
        ("weights", "non_torch", "activation", "kv_cache"),
    ),
    (re.compile(rf"Available KV cache memory: {_NUM} ?GiB"), ("kv_cache",)),
    (re.compile(rf"GPU KV cache size: {_NUM} tokens"), ("kv_tokens",)),
    (
        re.compile(rf"Maximum concurrency for {_NUM} tokens per request: {_NUM}x"),
        ("context", "sequences"),
    ),
    (re.compile(rf"Graph capturing finished in {_NUM} secs?, took {_NUM} ?GiB"), ("_seconds", "cuda_graph")),
    (re.compile(rf"Load weight end\..*?mem usage={_NUM} ?GB"), ("weights",)),
    (
        re.compile(rf"KV Cache is allocated\. .*?#tokens: {_NUM}, K size: {_NUM} ?GB, V size: {_NUM} ?GB"),
        ("kv_tokens", "_k", "_v"),
    ),
    (re.compile(rf"Capture cuda graph end\..*?mem usage={_NUM} ?GB"), ("cuda_graph",)),
)

GIB = 2**30
_COUNTS = {"kv_tokens", "context"}
_RATIOS = {"fraction", "sequences"}


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_memory_lines(lines: Iterable[str]) -> dict[str, float | int]:
    """The memory figures an engine's start-up log gives, per card: sizes in
    bytes (``weights``, ``non_torch``, ``activation``, ``kv_cache``,
    ``cuda_graph``, ``total``, ``budget``), counts (``kv_tokens``,
    ``context``) and ratios (``fraction``, ``sequences``). Empty when the log
    says none of them; each figure from the last line that gives it."""
    found: dict[str, float | int] = {}
    for line in lines:
        for pattern, fields in _PATTERNS:
            match = pattern.search(line)
            if match is None:
                continue
            values = dict(zip(fields, (_number(g) for g in match.groups()), strict=True))
            if "_k" in values:
                values["kv_cache"] = values.pop("_k") + values.pop("_v")
            values.pop("_seconds", None)
            for field, value in values.items():
                if field in _COUNTS:
                    found[field] = int(value)
                elif field in _RATIOS:
                    found[field] = value
                else:
                    found[field] = round(value * GIB)
    return found


def parse_nvidia_smi_apps(text: str) -> dict[int, int]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits``:
    bytes each process holds, summed over its cards (MiB as printed)."""
    held: dict[int, int] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        try:
            mib = int(float(parts[1]))
        except ValueError:
            continue
        held[int(parts[0])] = held.get(int(parts[0]), 0) + mib * 2**20
    return held


_SMI_CACHE: dict[str, Any] = {"at": 0.0, "held": {}}
_SMI_LOCK = threading.Lock()
SMI_TTL = 5.0  # seconds an nvidia-smi answer is reused: a status poll must stay cheap


def gpu_process_bytes() -> dict[int, int]:
    """Bytes each process holds on the cards, from nvidia-smi; empty where
    there is none (no driver, or the stand-in on a machine without a GPU)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    with _SMI_LOCK:
        if time.monotonic() - _SMI_CACHE["at"] < SMI_TTL:
            return dict(_SMI_CACHE["held"])
        try:
            out = subprocess.run(
                [exe, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=3,
                check=False,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        held = parse_nvidia_smi_apps(out)
        _SMI_CACHE.update(at=time.monotonic(), held=held)
        return dict(held)


def memory_report(log_path: Path, offset: int, pid: int | None, cards: int) -> dict[str, Any]:
    """What this run of a replica reported about its memory, per card: its
    log's memory lines (from ``offset``, the start of this run) and, where
    nvidia-smi answers, what its process holds (``card_bytes``, over its cards)."""
    try:
        with log_path.open("rb") as fh:
            fh.seek(offset)
            text = fh.read(1024 * 1024).decode("utf-8", "replace")
    except OSError:
        text = ""
    found: dict[str, Any] = dict(parse_memory_lines(text.splitlines()))
    if pid is not None:
        held = gpu_process_bytes().get(pid)
        if held is not None:
            found["card_bytes"] = held // max(cards, 1)
    return found
