"""What the stand-in engine says about its memory at start-up, and holds on its cards, as the
engine and release it plays would (agent/standin_engine.py ``--play``, ``--play-release``).

The figures follow each engine's own accounting, worked out from the cards the stand-in was
given (``$STANDIN_GPU_DIR/cards.json``, ``CUDA_VISIBLE_DEVICES``), its launch arguments and
what ``$STANDIN_GPU_DIR/models.json`` says of the model (its weight bytes, KV bytes a token,
sizes), so that the agent reads a replica's start-up lines and nvidia-smi as on a GPU node:

- vLLM takes ``--gpu-memory-utilization`` (0.9) of the card, or the weights and the terms beside
  them plus ``--kv-cache-memory-bytes``; the KV cache is what the budget leaves. From 0.21 the
  CUDA graphs are estimated inside the budget; before, captured beside it. Before 0.11, V0's lines.
- SGLang takes ``--mem-fraction-static`` (its own default for the card and TP) of what was free
  before the weights loaded (the card less the CUDA context) for weights and KV pool; graphs and
  activations come on top. After 0.5.10 its graph line names
  the captured kind ("Capture target decode CUDA graph end").
- llama.cpp takes what it needs: its layers' share of the weights, the KV cache for the context
  in 256-cell blocks, a compute buffer, on each card.
- FreeToken (no start-up lines known here) holds what it needs, the experts left in host memory.

Its own figures (the activation peak, non-torch memory, graphs, the CUDA context) are the
stand-in's: plausible, not any real run's. Standard library only.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = 2**30
MIB = 2**20
CONTEXT_GIB = 0.45  # the CUDA context and libraries every engine process holds beside its own figures

# The release each engine is played at when none is given: the releases the fleet runs today.
DEFAULT_RELEASES = {"vllm": "0.19.0", "standin": "0.19.0", "sglang": "0.5.11", "llamacpp": "b6500"}


def release_key(text: str) -> tuple[int, ...]:
    """ "0.19.0", "v0.5.10.post1" or "b6500" as numbers to compare ((0,) where there are none)."""
    cleaned = text.strip()
    if cleaned[:1] in ("b", "B") and cleaned[1:].isdigit():
        return (int(cleaned[1:]),)
    match = re.match(r"[vV]?(\d+(?:\.\d+)*)", cleaned)
    return tuple(int(p) for p in match[1].split(".")) if match else (0,)


@dataclass
class Startup:
    """What the stand-in prints and holds: its log lines and the MiB it holds on each card."""

    lines: list[str] = field(default_factory=list)
    held_mib: dict[int, int] = field(default_factory=dict)


def _flag(args: list[str], *names: str) -> str | None:
    value = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                value = args[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


def _number(args: list[str], *names: str) -> float | None:
    text = _flag(args, *names)
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _cards() -> list[tuple[int, float, str]]:
    """(index, total GiB, name) of each card this process was given."""
    directory = os.environ.get("STANDIN_GPU_DIR", "").strip()
    visible = [int(c) for c in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if c.strip().isdigit()]
    if not directory or not visible:
        return []
    try:
        cards = json.loads((Path(directory) / "cards.json").read_text())
    except (OSError, ValueError):
        return []
    known = {int(c["index"]): c for c in cards}
    return [
        (i, int(known[i]["memory_mib"]) / 1024, str(known[i].get("name", ""))) for i in visible if i in known
    ]


def model_facts(source: str | None) -> dict[str, Any] | None:
    """What ``$STANDIN_GPU_DIR/models.json`` says of the model at ``source``; None when nothing."""
    directory = os.environ.get("STANDIN_GPU_DIR", "").strip()
    if not directory or not source:
        return None
    try:
        models = json.loads((Path(directory) / "models.json").read_text())
    except (OSError, ValueError):
        return None
    facts = models.get(source)
    return facts if isinstance(facts, dict) and facts.get("weight_bytes") else None


def source_of(args: list[str]) -> str | None:
    """The model the launch names: --model-path (SGLang), -m (llama.cpp), --model, else the first
    bare argument (vLLM's positional model)."""
    named = _flag(args, "--model-path", "-m", "--model")
    if named:
        return named
    for i, arg in enumerate(args):
        if not arg.startswith("-") and (i == 0 or not args[i - 1].startswith("-")):
            return arg
    return None


def startup(engine: str, release: str, args: list[str], pid: int) -> Startup:
    """The start-up lines and card memory of ``engine`` at ``release`` for this launch; empty when
    the stand-in has no cards or knows nothing of the model (then it prints nothing of memory)."""
    cards = _cards()
    facts = model_facts(source_of(args))
    if not cards or facts is None:
        return Startup()
    if engine in ("vllm", "standin"):
        return _vllm(release, args, cards, facts, pid)
    if engine == "sglang":
        return _sglang(release, args, cards, facts)
    if engine == "llamacpp":
        return _llamacpp(args, cards, facts)
    return _needs(args, cards, facts)


def _kv_token_gib(facts: dict[str, Any], tp: int) -> float:
    heads = int(facts.get("kv_heads") or tp)
    return float(facts.get("kv_bytes_per_token") or 0) / max(min(tp, heads), 1) / GIB


def _context(args: list[str], facts: dict[str, Any], *flags: str) -> int:
    given = _number(args, *flags)
    return int(given) if given else int(facts.get("context_length") or 4096)


def _vllm(
    release: str, args: list[str], cards: list[tuple[int, float, str]], facts: dict[str, Any], pid: int
) -> Startup:
    key = release_key(release)
    total = cards[0][1]
    # vLLM's large-card defaults (8192 batched tokens, 1024 sequences) on cards of 70 GiB or more; up
    # to 0.20 not on an A100, from 0.21 on every such card (planning/engines.toml, [vllm.memory]).
    large = total >= 70 and (key >= (0, 21) or "a100" not in cards[0][2].lower())
    tp = int(_number(args, "--tensor-parallel-size", "-tp") or len(cards))
    # One rank of a replica across nodes (the launch policy's rank flags): this node holds pipeline
    # stage ``stage`` of ``pp``, an even share of the layers (the stand-in's split: a real one puts
    # the embedding on the first stage and the head on the last), and the KV cache of those layers.
    pp = int(_number(args, "--pipeline-parallel-size", "-pp") or 1)
    stage = int(_number(args, "--node-rank") or 0)
    headless = "--headless" in args
    fraction = _number(args, "--gpu-memory-utilization") or 0.9
    batch = int(_number(args, "--max-num-batched-tokens") or (8192 if large else 2048))
    seqs = min(int(_number(args, "--max-num-seqs") or (1024 if large else 256)), batch)
    hidden, ffn = int(facts.get("hidden_size") or 0), int(facts.get("intermediate_size") or 0)
    weights = facts["weight_bytes"] / tp / pp / GIB
    # The stand-in's peak: the forward pass and three fp32 copies of the sampler's logits.
    activation = (
        batch * 2 * (3 * ffn / tp + 4 * hidden) + 3 * seqs * int(facts.get("vocab_size") or 0) * 4
    ) / GIB
    non_torch = 0.25 + (0.5 if tp > 1 else 0.0)
    eager = "--enforce-eager" in args
    graphs = 0.0 if eager else 0.35
    inside = key >= (0, 21)
    pinned = _number(args, "--kv-cache-memory-bytes")
    budget = fraction * total
    if pinned:
        pool = pinned / GIB
    else:
        pool = max(budget - weights - activation - non_torch - (graphs if inside else 0.0), 0.0)
    per_token = _kv_token_gib(facts, tp) / pp
    tokens = int(pool / per_token) if per_token else 0
    context = _context(args, facts, "--max-model-len")
    held = (
        (weights + non_torch + pool + graphs) if pinned else (budget - activation + (0 if inside else graphs))
    )
    out = Startup(held_mib={index: round((held + CONTEXT_GIB) * 1024) for index, _, _ in cards})
    if key < (0, 11):
        return _vllm_v0(out, weights, non_torch, activation, pool, graphs, total, fraction, tokens, context)
    for rank in range(tp):
        who = _vllm_worker(rank, tp, stage, pp, pid)
        lines = [
            f"{who} INFO [gpu_model_runner.py] Model loading took {weights:.2f} GiB memory and 3.1 seconds"
        ]
        if inside and not eager:
            lines.append(
                f"{who} INFO [gpu_model_runner.py] Estimated CUDA graph memory: {graphs:.2f} GiB total"
            )
        if pinned:
            lines.append(
                f"{who} INFO [gpu_worker.py] Initial free memory {total - 0.5:.2f} GiB, reserved {pool:.2f} GiB "
                "memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling."
            )
        else:
            lines.append(f"{who} INFO [gpu_worker.py] Available KV cache memory: {pool:.2f} GiB")
        out.lines += lines
    core = f"(EngineCore pid={pid})"
    if not headless:  # the engine core (its scheduler and KV cache sizing) runs on rank 0 only
        out.lines += [
            f"{core} INFO [kv_cache_utils.py] GPU KV cache size: {tokens:,} tokens",
            f"{core} INFO [kv_cache_utils.py] Maximum concurrency for {context:,} tokens per request: "
            f"{tokens / context:.2f}x",
        ]
    for rank in range(tp):
        who = _vllm_worker(rank, tp, stage, pp, pid)
        if not inside and not eager:
            out.lines.append(
                f"{who} INFO [gpu_model_runner.py] Graph capturing finished in 2 secs, took {graphs:.2f} GiB"
            )
        out.lines.append(
            f"{who} INFO [gpu_worker.py] Free memory on device ({total - 0.5:.2f}/{total:.2f} GiB) on startup. "
            f"Desired GPU memory utilization is ({fraction:g}, {budget:.2f} GiB). Actual usage is {weights:.2f} GiB "
            f"for weight, {activation:.2f} GiB for peak activation, {non_torch:.2f} GiB for non-torch memory, "
            f"and {graphs:.2f} GiB for CUDAGraph memory."
        )
    return out


def _vllm_worker(rank: int, tp: int, stage: int, pp: int, pid: int) -> str:
    """How a vLLM worker's lines begin: ``(Worker_TP1 pid=...)``; with pipeline stages its stage
    too, ``(Worker_PP1_TP1 pid=...)`` (vllm/v1/executor/multiproc_executor.py, WorkerProc: the
    ``PP{stage}`` and ``TP{rank}`` suffix of the worker's name); one card alone: the engine core's."""
    suffix = "_".join(
        part for part in (f"PP{stage}" if pp > 1 else "", f"TP{rank}" if tp > 1 else "") if part
    )
    return f"(Worker_{suffix} pid={pid})" if suffix else f"(EngineCore pid={pid})"


def _vllm_v0(
    out: Startup,
    weights: float,
    non_torch: float,
    activation: float,
    pool: float,
    graphs: float,
    total: float,
    fraction: float,
    tokens: int,
    context: int,
) -> Startup:
    out.lines += [
        f"INFO model_runner.py:1115] Loading model weights took {weights:.4f} GB",
        f"INFO worker.py:267] the current vLLM instance can use total_gpu_memory ({total:.2f}GiB) "
        f"x gpu_memory_utilization ({fraction:.2f}) = {total * fraction:.2f}GiB",
        f"INFO worker.py:267] model weights take {weights:.2f}GiB; non_torch_memory takes {non_torch:.2f}GiB; "
        f"PyTorch activation peak memory takes {activation:.2f}GiB; the rest of the memory reserved for KV "
        f"Cache is {pool:.2f}GiB.",
        f"INFO executor_base.py:116] Maximum concurrency for {context} tokens per request: {tokens / context:.2f}x",
    ]
    if graphs:
        out.lines.append(
            f"INFO model_runner.py:1570] Graph capturing finished in 1 secs, took {graphs:.2f} GiB"
        )
    return out


def sglang_fraction(total_gib: float, tp: int) -> float:
    """SGLang's default --mem-fraction-static (server_args.py _handle_gpu_memory_settings), as the
    planner has it (planning/memory.py sglang_fraction)."""
    mb = total_gib * 1024
    if mb < 20 * 1024:
        chunked, graph_bs = 2048, 8
    elif mb < 35 * 1024:
        chunked, graph_bs = 2048, (24 if tp < 4 else 80)
    elif mb < 60 * 1024:
        chunked, graph_bs = 4096, (32 if tp < 4 else 160)
    elif mb < 160 * 1024:
        chunked, graph_bs = 8192, (256 if tp < 4 else 512)
    else:
        chunked, graph_bs = 16384, 512
    reserved = 512 + max(chunked, 2048) * 1.5 + graph_bs * 2 + tp / 8 * 1024
    if mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((mb - reserved) / mb, 3)


def _sglang(
    release: str, args: list[str], cards: list[tuple[int, float, str]], facts: dict[str, Any]
) -> Startup:
    total = cards[0][1]
    tp = int(_number(args, "--tp-size", "--tp", "--tensor-parallel-size") or len(cards))
    fraction = _number(args, "--mem-fraction-static") or sglang_fraction(total, tp)
    weights = facts["weight_bytes"] / tp / GIB
    # profile_max_num_token: the fraction is of what was free before the weights loaded
    free_before = total - CONTEXT_GIB
    pool = max(fraction * free_before - weights, 0.0)
    per_token = _kv_token_gib(facts, tp)
    tokens = int(pool / per_token) if per_token else 0
    graphs = 0.0 if "--disable-cuda-graph" in args else 0.45
    activations = 0.6  # the stand-in's: what SGLang's forward passes keep cached beside the pool
    renamed = release_key(release) > (0, 5, 10)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    out = Startup(
        held_mib={
            index: round(min(fraction * free_before + graphs + activations + CONTEXT_GIB, total) * 1024)
            for index, _, _ in cards
        }
    )
    for rank in range(tp):
        who = f"[{stamp} TP{rank}]" if tp > 1 else f"[{stamp}]"
        after_graphs = free_before - fraction * free_before - graphs
        if renamed:
            graph_line = (
                f"{who} Capture target decode CUDA graph end. elapsed=5.20 s, mem usage={graphs:.2f} GB, "
                f"avail mem={after_graphs:.2f} GB."
            )
        else:
            graph_line = (
                f"{who} Capture cuda graph end. Time elapsed: 5.20 s. mem usage={graphs:.2f} GB. "
                f"avail mem={after_graphs:.2f} GB."
            )
        out.lines += [
            f"{who} Load weight begin. avail mem={free_before:.2f} GB",
            f"{who} Load weight end. elapsed=3.10 s, type=StandinForCausalLM, dtype=torch.bfloat16, "
            f"avail mem={free_before - weights:.2f} GB, mem usage={weights:.2f} GB.",
            f"{who} KV Cache is allocated. #tokens: {tokens}, K size: {pool / 2:.2f} GB, V size: {pool / 2:.2f} GB",
        ]
        if graphs:
            out.lines.append(graph_line)
    return out


def _llamacpp(args: list[str], cards: list[tuple[int, float, str]], facts: dict[str, Any]) -> Startup:
    n = len(cards)
    context = _context(args, facts, "--ctx-size", "-c")
    cells = math.ceil(context / 256) * 256
    weights = facts["weight_bytes"] / n / MIB
    kv = cells * float(facts.get("kv_bytes_per_token") or 0) / n / MIB
    compute = 300.75
    out = Startup(
        held_mib={index: round(weights + kv + compute + CONTEXT_GIB * 1024) for index, _, _ in cards}
    )
    for i in range(n):
        out.lines.append(f"load_tensors:        CUDA{i} model buffer size = {weights:10.2f} MiB")
    for i in range(n):
        out.lines.append(f"llama_kv_cache:      CUDA{i} KV buffer size = {kv:10.2f} MiB")
    layers = int(facts.get("layers") or 0)
    out.lines.append(
        f"llama_kv_cache: size = {kv * n:8.2f} MiB ({cells:6d} cells, {layers:3d} layers,  1/1 seqs)"
    )
    for i in range(n):
        out.lines.append(f"llama_context:      CUDA{i} compute buffer size = {compute:10.2f} MiB")
    return out


def _needs(args: list[str], cards: list[tuple[int, float, str]], facts: dict[str, Any]) -> Startup:
    """An engine without known lines (FreeToken): it holds its weights without the experts, the
    cache for its context and a runtime, on its one card."""
    context = _context(args, facts, "--max-seq-len-override", "--max_seq_len")
    dense = max(facts["weight_bytes"] - int(facts.get("expert_bytes") or 0), 0) / GIB
    kv = context * float(facts.get("kv_bytes_per_token") or 0) / GIB
    held = dense + kv + 1.0 + CONTEXT_GIB
    return Startup(held_mib={index: round(min(held, total) * 1024) for index, total, _ in cards})


# STANDIN_MEMORY: figures given whole, printed as vLLM's V0 worker printed them (0.6 to 0.8).
MEMORY_KEYS = (
    "weights",
    "non_torch",
    "activation",
    "kv_cache",
    "cuda_graph",
    "total",
    "fraction",
    "context",
    "sequences",
)


def given_lines(text: str) -> list[str]:
    """The lines STANDIN_MEMORY's "key=value,..." figures make (``given_figures``, ``v0_lines``): a
    wrong pair is said first and left out."""
    said: list[str] = []
    figures = given_figures(text, said)
    return said + v0_lines(figures)


def given_figures(text: str, said: list[str]) -> dict[str, float]:
    """STANDIN_MEMORY's "key=value,..." pairs; a wrong one is said (in ``said``) and left out."""
    figures: dict[str, float] = {}
    for part in text.split(","):
        key, _, value = part.strip().partition("=")
        if not key:
            continue
        try:
            if key not in MEMORY_KEYS:
                raise ValueError(key)
            figures[key] = float(value)
        except ValueError:
            said.append(f"STANDIN_MEMORY: ignoring {part.strip()!r} (keys: {', '.join(MEMORY_KEYS)})")
    return figures


def v0_lines(figures: dict[str, float]) -> list[str]:
    """vLLM's start-up memory lines, as its V0 worker prints them."""
    f = {k: figures.get(k, 0.0) for k in MEMORY_KEYS}
    lines = [f"INFO model_runner.py:1115] Loading model weights took {f['weights']:.4f} GB"]
    if "total" in figures:
        fraction = figures.get("fraction", 0.9)
        lines.append(
            f"INFO worker.py:267] the current vLLM instance can use total_gpu_memory ({f['total']:.2f}GiB) "
            f"x gpu_memory_utilization ({fraction:.2f}) = {f['total'] * fraction:.2f}GiB"
        )
    lines.append(
        f"INFO worker.py:267] model weights take {f['weights']:.2f}GiB; non_torch_memory takes "
        f"{f['non_torch']:.2f}GiB; PyTorch activation peak memory takes {f['activation']:.2f}GiB; "
        f"the rest of the memory reserved for KV Cache is {f['kv_cache']:.2f}GiB."
    )
    if "context" in figures:
        lines.append(
            f"INFO executor_base.py:116] Maximum concurrency for {int(f['context'])} tokens per request: "
            f"{f['sequences']:.2f}x"
        )
    if "cuda_graph" in figures:
        lines.append(
            f"INFO model_runner.py:1570] Graph capturing finished in 1 secs, took {f['cuda_graph']:.2f} GiB"
        )
    return lines
