"""Planned against measured: what each card of a replica was planned to hold
(the memory answer, ``CardMemory.as_dict()``) beside what its engine and card
reported (``agent/llmgw_agent/memory_lines.py``: bytes per card)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

K = TypeVar("K", str, tuple[str, str])


@dataclass(frozen=True)
class Row:
    """One term, planned and measured, bytes per card (None: not known)."""

    term: str
    label: str
    planned: int | None
    measured: int | None

    @property
    def difference(self) -> float | None:
        """planned / measured - 1: above 0 the planner asked for more than the engine took."""
        if self.planned is None or not self.measured:
            return None
        return self.planned / self.measured - 1


def _sum(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def measured_need(measured: Mapping[str, Any]) -> int | None:
    """The engine's own need for one full-context sequence: weights, the
    terms it logged, and its KV pool over its maximum concurrency; None
    without the weights."""
    if measured.get("weights") is None:
        return None
    kv = None
    if measured.get("kv_cache") is not None and measured.get("sequences"):
        kv = round(measured["kv_cache"] / measured["sequences"])
    parts = [measured.get(k) for k in ("weights", "non_torch", "activation", "cuda_graph")]
    return _sum([*parts, kv])


def compare(planned: Mapping[str, Any], measured: Mapping[str, Any]) -> list[Row]:
    """Each term the two sides share, then the need. A planned term the log
    did not give is measured None; the need compares only the terms the log
    gave, so that a missing line does not read as a saving."""
    p = dict(planned or {})
    m = dict(measured or {})
    non_torch = _sum([p.get("non_torch"), p.get("comm_buffers")])
    kv_measured = (
        round(m["kv_cache"] / m["sequences"])
        if m.get("kv_cache") is not None and m.get("sequences")
        else None
    )
    rows = [
        Row("weights", "weights", p.get("weights"), m.get("weights")),
        Row("kv", "KV cache, one full-context sequence", p.get("kv"), kv_measured),
        Row("activation", "activation peak", p.get("activation"), m.get("activation")),
        Row("non_torch", "outside PyTorch (with communication buffers)", non_torch, m.get("non_torch")),
        Row("cuda_graph", "CUDA graphs", p.get("cuda_graph"), m.get("cuda_graph")),
    ]
    shared = [r for r in rows if r.measured is not None]
    if shared and m.get("weights") is not None:
        rows.append(
            Row(
                "need",
                "need (the terms measured)",
                _sum(r.planned for r in shared),
                _sum(r.measured for r in shared),
            )
        )
    if m.get("kv_tokens") is not None or p.get("kv_tokens") is not None:
        rows.append(Row("kv_tokens", "tokens the KV cache holds", p.get("kv_tokens"), m.get("kv_tokens")))
    if m.get("card_bytes") is not None:
        rows.append(Row("card", "the card holds (nvidia-smi)", p.get("budget"), m.get("card_bytes")))
    return rows


def need_difference(planned: Mapping[str, Any], measured: Mapping[str, Any]) -> float | None:
    """planned / measured - 1 of the need over the terms measured; None when unknown."""
    row = next((r for r in compare(planned, measured) if r.term == "need"), None)
    return row.difference if row else None


def drift(
    pairs: Iterable[tuple[K, Mapping[str, Any], Mapping[str, Any]]],
) -> dict[K, tuple[float, int]]:
    """Per engine (or per engine and release: any key), the mean
    planned-over-measured difference of the need and how many replicas it is
    over: whether the memory model drifts from what the engines really take on
    these cards."""
    sums: dict[K, list[float]] = {}
    for engine, planned, measured in pairs:
        diff = need_difference(planned, measured)
        if diff is not None:
            sums.setdefault(engine, []).append(diff)
    return {engine: (sum(d) / len(d), len(d)) for engine, d in sorted(sums.items())}
