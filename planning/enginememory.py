"""How an engine fills a card, as data: the ``[<engine>.memory]`` table of
``engines.toml``, loaded and checked.

Each figure is a term of the engine's own start-up accounting (vLLM's memory
profile, SGLang's static fraction, llama.cpp's buffers), with where it comes
from kept beside it in ``sources``; ``memory.py`` turns them into bytes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

BUDGET_RULES = ("fraction", "free_fraction", "sglang", "none")
# The compute buffer's coefficients (llama.cpp): the larger of the output phase, logits_outputs x
# vocabulary + hidden_out x hidden + ffn_out x intermediate (fp32 a ubatch token), and the layer phase,
# ffn_layer x intermediate + hidden_layer x hidden (fp32) + mask_bytes a KV cell, plus kq_bytes a KV
# cell and attention head with flash attention off. The ubatch: ubatch_flags, else batch_tokens_default.
COMPUTE_KEYS = (
    "logits_outputs",
    "hidden_out",
    "ffn_out",
    "ffn_layer",
    "hidden_layer",
    "mask_bytes",
    "kq_bytes",
)
SLIDING_RULES = ("batch", "window", "full")

# Every term the planner can show; an engine's sources must name each it uses.
TERMS = ("budget", "weights", "kv", "activation", "non_torch", "comm_buffers", "cuda_graph", "runtime")


@dataclass(frozen=True)
class EngineMemory:
    """One engine's memory model (see the ``[vllm.memory]`` table for each key)."""

    version: str
    budget_rule: str = "none"
    budget_flag: str | None = None
    budget_default: float = 1.0
    batch_tokens_flag: str | None = None
    batch_tokens_default: int = 2048
    batch_tokens_default_large: int | None = None
    max_seqs_flag: str | None = None
    max_seqs_default: int = 256
    max_seqs_default_large: int | None = None
    large_card_gib: float = 70.0
    large_card_except: tuple[str, ...] = ()
    activation_ffn: float = 0.0
    activation_hidden: float = 0.0
    activation_hidden_tp: float = 0.0
    sampler_copies: float = 0.0
    # The fused-MoE kernel's buffers, in copies of its own sizes (0: a MoE model is planned as a
    # dense one): per batch token, experts_per_token rows of max(2 x expert width / TP, hidden)
    # (cache13) and expert width / TP (cache2), in the model dtype, over at most
    # activation_moe_chunk tokens at once (memory.py moe_forward).
    activation_moe: float = 0.0
    activation_moe_chunk: int = 32768
    non_torch_gib: float = 0.0
    comm_buffers_gib: float = 0.0
    comm_buffers_min_card_gib: float = 0.0
    cuda_graph_gib: float = 0.0
    # Captured graphs grow with the model: this fraction of one card's weights beside cuda_graph_gib.
    cuda_graph_per_weight: float = 0.0
    # ... and this many GiB a layer (graphs are captured piecewise, between the attention layers).
    cuda_graph_per_layer: float = 0.0
    eager_flags: tuple[str, ...] = ()
    runtime_gib: float = 0.0
    kv_block: int = 1
    kv_block_flag: str | None = None
    kv_dtype_flags: tuple[str, ...] = ()
    kv_dtype_bytes: Mapping[str, float] = field(default_factory=dict)
    # expert format -> (multiple one card's expert width is rounded up to,
    # multiple the hidden size is rounded up to) in the expert tensors
    expert_padding: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    sliding: str = "window"
    # Hybrid models (full and sliding layers): the engine groups each kind's
    # layers into groups of one size, the smaller kind's count (or the larger
    # one's when it is below this many times the smaller), and pads the last
    # group of a kind; the padding layers hold cache like real ones. 0: no
    # grouping.
    kv_group_ratio: float = 0.0
    sources: Mapping[str, str] = field(default_factory=dict)
    # The engine releases these figures describe: from ``since`` (inclusive)
    # up to ``below`` (exclusive); None: open on that side.
    since: tuple[int, ...] | None = None
    below: tuple[int, ...] | None = None
    # False: the engine captures its CUDA graphs outside its budget (after
    # sizing the KV cache), so they take the card's headroom, not the budget.
    cuda_graph_inside: bool = True
    # A flag that pins the KV pool in bytes, in place of the budget's fraction
    # (vLLM's --kv-cache-memory-bytes).
    kv_pool_flag: str | None = None
    # A flag that has the engine fit itself to the card (llama.cpp's --fit on): the budget is then
    # the card less a margin (fit_target_flag in MiB, or fit_target_default_mib).
    fit_flags: tuple[str, ...] = ()
    fit_target_flag: str | None = None
    fit_target_default_mib: float = 0.0
    # llama.cpp's compute buffer (the graph it reserves for one ubatch), in place of the activation
    # formula above: bytes of fp32 a ubatch token per model size, keyed as COMPUTE_KEYS says; empty:
    # the engine has none. The ubatch is batch_tokens (its flag and default).
    compute_buffer: Mapping[str, float] = field(default_factory=dict)
    # The flag that turns flash attention off ("off", "0", "false", "disabled"); on otherwise.
    flash_attn_flags: tuple[str, ...] = ()
    # The flags of the ubatch the compute buffer is reserved for (default: batch_tokens_default).
    ubatch_flags: tuple[str, ...] = ()

    def covers(self, release: tuple[int, ...]) -> bool:
        """Whether ``release`` (as ``release_key`` reads it) is in this table's range."""
        return (self.since is None or release >= self.since) and (self.below is None or release < self.below)


_RELEASE = re.compile(r"v?(\d+(?:\.\d+)*)")


def release_key(text: str | None) -> tuple[int, ...] | None:
    """ "0.19.1", "v0.10.1.1", "0.6.4.post1", "0.11.0rc2", "b6123" (llama.cpp's build) as
    numbers to compare; None when it is blank or names no release."""
    if not text or not isinstance(text, str):
        return None
    cleaned = text.strip()
    if cleaned[:1] in ("b", "B") and cleaned[1:].isdigit():
        return (int(cleaned[1:]),)
    match = _RELEASE.match(cleaned)
    return tuple(int(part) for part in match[1].split(".")) if match else None


_FLOATS = {
    "budget_default": (0.01, 1.0),
    "large_card_gib": (0.0, 10_000.0),
    "activation_ffn": (0.0, 1_000.0),
    "activation_hidden": (0.0, 1_000.0),
    "activation_hidden_tp": (0.0, 1_000.0),
    "sampler_copies": (0.0, 1_000.0),
    "activation_moe": (0.0, 1_000.0),
    "non_torch_gib": (0.0, 1024.0),
    "comm_buffers_gib": (0.0, 1024.0),
    "comm_buffers_min_card_gib": (0.0, 10_000.0),
    "cuda_graph_gib": (0.0, 1024.0),
    "cuda_graph_per_weight": (0.0, 1.0),
    "cuda_graph_per_layer": (0.0, 1.0),
    "fit_target_default_mib": (0.0, 1_048_576.0),
    "runtime_gib": (0.0, 1024.0),
    "kv_group_ratio": (0.0, 100.0),
}
_INTS = {
    "batch_tokens_default": 1,
    "batch_tokens_default_large": 1,
    "max_seqs_default": 1,
    "max_seqs_default_large": 1,
    "kv_block": 1,
    "activation_moe_chunk": 1,
}
_FLAGS = {
    "budget_flag",
    "batch_tokens_flag",
    "max_seqs_flag",
    "kv_block_flag",
    "kv_pool_flag",
    "fit_target_flag",
}
_FLAG_LISTS = {"eager_flags", "kv_dtype_flags", "fit_flags", "flash_attn_flags", "ubatch_flags"}
_STRINGS = {"version", "budget_rule", "sliding"}
_OTHER = {
    "large_card_except",
    "kv_dtype_bytes",
    "expert_padding",
    "sources",
    "since",
    "below",
    "cuda_graph_inside",
    "compute_buffer",
}


def parse_memory(table: Any, fail: Callable[[str, str], Exception]) -> EngineMemory:
    """The ``memory`` table of one engine, checked; ``fail(key, problem)``
    builds the error naming the key."""
    if not isinstance(table, dict):
        raise fail("memory", "must be a table of the engine's memory terms")
    known = set(_FLOATS) | set(_INTS) | _FLAGS | _FLAG_LISTS | _STRINGS | _OTHER
    for key in table:
        if key not in known:
            raise fail(f"memory.{key}", "unknown key")
    values: dict[str, Any] = {}
    for key, (low, high) in _FLOATS.items():
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
                raise fail(f"memory.{key}", f"must be a number from {low:g} to {high:g}, not {value!r}")
            values[key] = float(value)
    for key, low in _INTS.items():
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise fail(f"memory.{key}", f"must be a whole number of at least {low}, not {value!r}")
            values[key] = value
    for key in _FLAGS:
        if key in table:
            value = table[key]
            if not isinstance(value, str) or not value.startswith("-") or "=" in value or " " in value:
                raise fail(
                    f"memory.{key}", f"must be a flag such as '--gpu-memory-utilization', not {value!r}"
                )
            values[key] = value
    for key in _FLAG_LISTS:
        if key in table:
            value = table[key]
            if not isinstance(value, list) or not all(
                isinstance(v, str) and v.startswith("-") for v in value
            ):
                raise fail(f"memory.{key}", "must be a list of flags")
            values[key] = tuple(value)
    for key in _STRINGS:
        if key in table and not isinstance(table[key], str):
            raise fail(f"memory.{key}", f"must be a string, not {table[key]!r}")
    if "version" not in table or not table["version"].strip():
        raise fail("memory.version", "say which release of the engine these figures are for")
    values["version"] = table["version"]
    for key in ("since", "below"):
        if key in table:
            release = release_key(table[key]) if isinstance(table[key], str) else None
            if release is None:
                raise fail(f"memory.{key}", f'must be an engine release such as "0.11", not {table[key]!r}')
            values[key] = release
    if (
        values.get("since") is not None
        and values.get("below") is not None
        and values["since"] >= values["below"]
    ):
        raise fail("memory.below", "must be a later release than since")
    inside = table.get("cuda_graph_inside", True)
    if not isinstance(inside, bool):
        raise fail("memory.cuda_graph_inside", f"must be true or false, not {inside!r}")
    values["cuda_graph_inside"] = inside
    rule = table.get("budget_rule", "none")
    if rule not in BUDGET_RULES:
        raise fail("memory.budget_rule", f"must be one of {', '.join(BUDGET_RULES)}, not {rule!r}")
    values["budget_rule"] = rule
    sliding = table.get("sliding", "window")
    if sliding not in SLIDING_RULES:
        raise fail("memory.sliding", f"must be one of {', '.join(SLIDING_RULES)}, not {sliding!r}")
    values["sliding"] = sliding
    if rule in ("fraction", "free_fraction") and "budget_flag" not in values:
        raise fail("memory.budget_flag", "a fraction budget needs the engine's flag for it")

    excepted = table.get("large_card_except", [])
    if not isinstance(excepted, list) or not all(isinstance(v, str) and v for v in excepted):
        raise fail("memory.large_card_except", "must be a list of class-name fragments")
    values["large_card_except"] = tuple(v.lower() for v in excepted)

    dtypes = table.get("kv_dtype_bytes", {})
    if not isinstance(dtypes, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 8 for v in dtypes.values()
    ):
        raise fail("memory.kv_dtype_bytes", "must map each cache dtype to its bytes a value (0 to 8)")
    if values.get("kv_dtype_flags") and "auto" not in dtypes:
        raise fail("memory.kv_dtype_bytes", "must say what 'auto' (no flag) takes")
    values["kv_dtype_bytes"] = {str(k): float(v) for k, v in dtypes.items()}

    padding = table.get("expert_padding", {})
    if not isinstance(padding, dict) or not all(
        isinstance(v, list)
        and len(v) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v)
        for v in padding.values()
    ):
        raise fail(
            "memory.expert_padding",
            "must map each expert format to [width multiple, hidden multiple], such as mxfp4 = [128, 256]",
        )
    values["expert_padding"] = {str(k): (v[0], v[1]) for k, v in padding.items()}

    compute = table.get("compute_buffer", {})
    if not isinstance(compute, dict) or not all(
        k in COMPUTE_KEYS and isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1000
        for k, v in compute.items()
    ):
        raise fail(
            "memory.compute_buffer",
            f"must map some of {', '.join(COMPUTE_KEYS)} to a number from 0 to 1000",
        )
    values["compute_buffer"] = {str(k): float(v) for k, v in compute.items()}

    sources = table.get("sources", {})
    if not isinstance(sources, dict) or not all(isinstance(v, str) and v.strip() for v in sources.values()):
        raise fail("memory.sources", "must map each term to where it comes from")
    for term in sources:
        if term not in TERMS:
            raise fail(f"memory.sources.{term}", f"unknown term; the terms are {', '.join(TERMS)}")
    used = _terms_used(values)
    for term in used:
        if term not in sources:
            raise fail(
                f"memory.sources.{term}",
                "every term the engine uses needs its source (engine, version, file)",
            )
    values["sources"] = dict(sources)
    return EngineMemory(**values)


def _terms_used(values: dict[str, Any]) -> list[str]:
    used = ["weights", "kv"]
    if values["budget_rule"] != "none":
        used.append("budget")
    if (
        values.get("activation_ffn")
        or values.get("activation_hidden")
        or values.get("sampler_copies")
        or values.get("compute_buffer")
    ):
        used.append("activation")
    for key, term in (
        ("non_torch_gib", "non_torch"),
        ("comm_buffers_gib", "comm_buffers"),
        ("cuda_graph_gib", "cuda_graph"),
        ("cuda_graph_per_weight", "cuda_graph"),
        ("cuda_graph_per_layer", "cuda_graph"),
        ("runtime_gib", "runtime"),
    ):
        if values.get(key):
            used.append(term)
    return used
