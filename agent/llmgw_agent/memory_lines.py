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

vLLM 0.11 and later also print (``gpu_worker.py``; "consumed memory (weights +
non-torch)" in the later spelling, "for weight" and "for non-torch memory" in
the earlier; the CUDA-graph estimate from 0.21, when it is inside the budget)::

    Free memory on device (78.66/79.19 GiB) on startup. Desired GPU memory utilization is (0.9, 71.27 GiB).
        Actual usage is 14.08 GiB for weight, 1.97 GiB for peak activation, 0.07 GiB for non-torch
        memory, and 0.67 GiB for CUDAGraph memory. ...
    Estimated CUDA graph memory: 0.36 GiB total
    CUDA graph pool memory: 4.13 GiB (actual), 4.99 GiB (estimated), difference: 0.86 GiB (20.9%).
    GPU KV cache size: 460,496 tokens, Maximum concurrency for 131,072 tokens per request: 3.51x

SGLang after 0.5.10 names the graph it captured (``model_runner.py``, sgl-project/sglang#31168),
one line a kind, summed per rank; its KV line may give one "KV size"::

    Capture target decode CUDA graph end. elapsed=4.81 s, mem usage=0.27 GB, avail mem=5.34 GB.
    KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1226984, KV size: 9.21 GB

llama.cpp (``llama-model-loader``/``llama-kv-cache``/``llama-context``; MiB, one line a card,
the spelling of the function before the colon changing by build)::

    load_tensors:        CUDA0 model buffer size =  4095.05 MiB   (llm_load_tensors: CUDA0 buffer size = ...)
    llama_kv_cache:      CUDA0 KV buffer size =  6144.00 MiB      (llama_kv_cache_init / _unified)
    llama_kv_cache: size = 6144.00 MiB ( 65536 cells,  48 layers,  4/1 seqs), ...
    llama_context:      CUDA0 compute buffer size =   300.75 MiB  (llama_new_context_with_model, sched_reserve)

A line names its rank where the engine says it: vLLM's ``(Worker_TP1 pid=...)`` (``(Worker_PP1_TP1
pid=...)`` on a pipeline stage of a replica across nodes, whose ranks are this node's cards), SGLang's
``[... TP1]``, llama.cpp's ``CUDA1``; a line without one is rank 0's (the single process, or
vLLM's driver).

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
    (re.compile(rf"Capture cuda graph end\..*?mem usage={_NUM} ?GB"), ("_graph_decode",)),
    (
        re.compile(
            rf"Free memory on device \({_NUM}/{_NUM} GiB\) on startup\. "
            rf"Desired GPU memory utilization is \({_NUM}, {_NUM} GiB\)"
        ),
        ("_free", "total", "fraction", "budget"),
    ),
    (re.compile(rf"Actual usage is {_NUM} GiB for weight,"), ("weights",)),
    (re.compile(rf"Actual usage is {_NUM} GiB for consumed memory \(weights \+ non-torch\)"), ("_consumed",)),
    (re.compile(rf"{_NUM} GiB for peak activation"), ("activation",)),
    (re.compile(rf"{_NUM} GiB for non-torch memory"), ("non_torch",)),
    (re.compile(rf"{_NUM} GiB for CUDAGraph memory"), ("cuda_graph",)),
    (re.compile(rf"Estimated CUDA graph memory: {_NUM} GiB total"), ("cuda_graph_estimate",)),
    (re.compile(rf"CUDA graph pool memory: {_NUM} GiB \(actual\)"), ("cuda_graph",)),
    (
        re.compile(rf"reserved {_NUM} GiB memory for KV Cache as specified by kv_cache_memory_bytes"),
        ("kv_cache",),
    ),
    (
        re.compile(rf"KV Cache is allocated\. .*?#tokens: {_NUM}, KV size: {_NUM} ?GB"),
        ("kv_tokens", "kv_cache"),
    ),
    (
        re.compile(
            rf"Capture (?:target |draft )?(\w+) (?:CUDA|cuda) graph end\. elapsed=.*?mem usage={_NUM} ?GB"
        ),
        ("_graph_kind", "_graph"),
    ),
    (re.compile(rf"CUDA\d+ (?:model )?buffer size = +{_NUM} MiB"), ("_weights_mib",)),
    (re.compile(rf"CUDA\d+ KV buffer size = +{_NUM} MiB"), ("_kv_mib",)),
    (
        re.compile(rf"llama_kv_cache[a-z_]*: size = +{_NUM} MiB \( *{_NUM} cells"),
        ("_kv_total_mib", "kv_tokens"),
    ),
    (re.compile(rf"CUDA\d+ compute buffer size = +{_NUM} MiB"), ("_compute_mib",)),
)

# What names a line's rank (tensor-parallel rank, or llama.cpp's card); None: rank 0's.
_RANKS = (
    # vLLM's multiprocess workers: (Worker_TP1 pid=...), (Worker_TP1_EP1 ...), and with pipeline
    # stages (a replica across nodes) (Worker_PP1_TP1 ...) or (VllmWorker PP1_TP1 ...): the TP rank
    # names the card on this node (multiproc_executor.py WorkerProc's PP/TP suffix).
    re.compile(r"\((?:Vllm)?Worker[_ ](?:PP\d+_)?TP(\d+)"),
    re.compile(r"\[[^\]]*\bTP(\d+)\]"),  # SGLang: [2026-07-21 13:35:33 TP1]
    re.compile(r"\bCUDA(\d+) (?:model |KV |compute )?buffer size"),  # llama.cpp: a buffer on card N
)
_OTHER_RANK = -1  # vLLM V0's (VllmWorkerProcess pid=...): a worker whose rank the line does not say

GIB = 2**30
_COUNTS = {"kv_tokens", "context"}
_RATIOS = {"fraction", "sequences"}


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _rank_of(line: str) -> int:
    for pattern in _RANKS:
        match = pattern.search(line)
        if match is not None:
            return int(match[1])
    return _OTHER_RANK if "VllmWorkerProcess" in line else 0


def _read(line: str, found: dict[str, Any]) -> None:
    for pattern, fields in _PATTERNS:
        match = pattern.search(line)
        if match is None:
            continue
        groups = match.groups()
        if fields == ("_graph_kind", "_graph"):
            # SGLang after 0.5.10: one line a captured kind (prefill, decode, verify, extend), summed.
            found.setdefault("_graphs", {})[groups[0]] = round(_number(groups[1]) * GIB)
            continue
        values = dict(zip(fields, (_number(g) for g in groups), strict=True))
        if "_k" in values:
            values["kv_cache"] = values.pop("_k") + values.pop("_v")
        if "_graph_decode" in values:
            found.setdefault("_graphs", {})["decode"] = round(values.pop("_graph_decode") * GIB)
        if "_consumed" in values:
            # "consumed memory (weights + non-torch)": the weights are "Model loading took"'s figure.
            found["_consumed"] = round(values.pop("_consumed") * GIB)
        for key, into in (
            ("_weights_mib", "weights"),
            ("_kv_mib", "kv_cache"),
            ("_compute_mib", "activation"),
        ):
            if key in values:
                found[into] = round(values.pop(key) * 2**20)
        values.pop("_kv_total_mib", None)
        values.pop("_seconds", None)
        values.pop("_free", None)
        for field, value in values.items():
            if field in _COUNTS:
                found[field] = int(value)
            elif field in _RATIOS:
                found[field] = value
            else:
                found[field] = round(value * GIB)


def _finish(found: dict[str, Any]) -> dict[str, float | int]:
    graphs = found.pop("_graphs", None)
    if graphs and "cuda_graph" not in found:
        found["cuda_graph"] = sum(graphs.values())
    consumed = found.pop("_consumed", None)
    if consumed is not None and "weights" in found and "non_torch" not in found:
        found["non_torch"] = max(consumed - found["weights"], 0)
    return found


def parse_memory_ranks(lines: Iterable[str]) -> dict[int, dict[str, float | int]]:
    """The memory figures an engine's start-up log gives, by rank (see the module's
    note on how a line names its rank): each rank's as ``parse_memory_lines``
    gives them. A rank the engine said nothing about is absent; vLLM V0's
    workers whose rank the line does not name are under -1."""
    ranks: dict[int, dict[str, Any]] = {}
    for line in lines:
        _read(line, ranks.setdefault(_rank_of(line), {}))
    return {rank: _finish(found) for rank, found in sorted(ranks.items()) if found}


def parse_memory_lines(lines: Iterable[str]) -> dict[str, float | int]:
    """The memory figures an engine's start-up log gives, per card: sizes in
    bytes (``weights``, ``non_torch``, ``activation``, ``kv_cache``,
    ``cuda_graph``, ``cuda_graph_estimate``, ``total``, ``budget``), counts
    (``kv_tokens``, ``context``) and ratios (``fraction``, ``sequences``).
    Empty when the log says none of them; each figure from the last line that
    gives it, rank 0's over the other ranks' (a figure only another rank
    printed, such as vLLM V0's budget line from a worker, is kept)."""
    ranks = parse_memory_ranks(list(lines))
    found: dict[str, float | int] = {}
    for rank in sorted(ranks, key=lambda r: (r == 0, r)):
        found.update(ranks[rank])
    return found


# The figures each engine's start-up prints, by the engine's name in the registry; one that
# the log does not give is reported missing (a new spelling, a line turned off), not guessed.
# The project's own stand-in engine prints memory lines only when told to (STANDIN_MEMORY), so
# nothing is expected of it; playing an engine (--play), it runs under that engine's name.
EXPECTED: dict[str, tuple[str, ...]] = {
    "vllm": ("weights", "kv_cache", "sequences", "cuda_graph"),
    "sglang": ("weights", "kv_cache", "kv_tokens", "cuda_graph"),
    "llamacpp": ("weights", "kv_cache"),
}
# Where a flag turns the graphs off, none are expected.
_NO_GRAPHS = {"--enforce-eager", "--disable-cuda-graph"}


def missing_figures(engine: str, found: dict[str, Any], args: Iterable[str] = ()) -> list[str]:
    """The figures ``engine``'s start-up should have printed and this log did not."""
    args = list(args)
    expected = list(EXPECTED.get(engine, ()))
    if "--headless" in args:  # vLLM's rank > 0: no engine core here, so no concurrency line
        expected = [e for e in expected if e != "sequences"]
    if any(a.split("=", 1)[0] in _NO_GRAPHS for a in args):
        expected = [e for e in expected if e != "cuda_graph"]
    return [e for e in expected if e not in found]


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


def gpu_process_bytes(pid: int | None = None) -> dict[int, int]:
    """Bytes each process holds on the cards, from nvidia-smi; empty where
    there is none (no driver, or the stand-in on a machine without a GPU).
    An answer is reused for SMI_TTL seconds, unless it lacks ``pid`` (a process
    that started since) and is a quarter of a second old."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    with _SMI_LOCK:
        age = time.monotonic() - _SMI_CACHE["at"]
        if age < SMI_TTL and (pid is None or pid in _SMI_CACHE["held"] or age < 0.25):
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


def memory_report(
    log_path: Path,
    offset: int,
    pid: int | None,
    cards: int,
    engine: str = "",
    args: Iterable[str] = (),
) -> dict[str, Any]:
    """What this run of a replica reported about its memory, per card: its
    log's memory lines (from ``offset``, the start of this run), rank 0's
    at the top and every rank's under ``ranks``, the figures ``engine``
    should have printed and did not (``missing``) and, where nvidia-smi
    answers, what its process holds (``card_bytes``, over its cards)."""
    try:
        with log_path.open("rb") as fh:
            fh.seek(offset)
            text = fh.read(1024 * 1024).decode("utf-8", "replace")
    except OSError:
        text = ""
    lines = text.splitlines()
    found: dict[str, Any] = dict(parse_memory_lines(lines))
    ranks = parse_memory_ranks(lines)
    if len(ranks) > 1:
        found["ranks"] = {str(rank): figures for rank, figures in ranks.items()}
    if engine and (missing := missing_figures(engine, found, args)):
        found["missing"] = missing
    if pid is not None:
        held = gpu_process_bytes(pid).get(pid)
        if held is not None:
            found["card_bytes"] = held // max(cards, 1)
    return found
