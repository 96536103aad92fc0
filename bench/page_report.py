"""What bench/pages.py prints: its phases' names, the table of a run (a row a target, a column a
phase, each p50 against the floor's in the same phase with the load beside it), the in-process
table, and the machine it ran on."""

from __future__ import annotations

import os
import statistics
from pathlib import Path


def in_process_table(rows: dict[str, dict[str, float]]) -> str:
    lines = [
        "| request | cold | of which in the database | queries | warm | of which in the database | queries |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r in rows.items():
        lines.append(
            f"| {label} | {r['cold_ms']} ms | {r['cold_db_ms']} ms | {r['cold_queries']:g} | {r['warm_ms']} ms | "
            f"{r['warm_db_ms']} ms | {r['warm_queries']:g} |"
        )
    return "\n".join(lines)


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


PHASES = {
    "warm": "warm: nothing written while reading",
    "replica": "right after a replica's state changes (one write, then one request)",
    "structure": "right after a model is edited (one write, then one request)",
    "sampler": "while the sampler's writes run at the default rate",
}


def table(results: dict[str, list[dict]], meta: dict) -> str:
    """One table: a row per target, a column per phase: p50 ms, × the floor's p50 in the same phase
    (bold within 3×), and the load average (1 minute) while it was measured."""
    phases = list(results)
    lines = [
        f"{meta['when']}, {meta['machine']}; {meta['fleet']}; load {meta['load_at_start']} at the start, "
        f"{meta.get('load_at_end', '?')} at the end",
        f"{meta['rounds']} rounds; warm and sampler: {meta['requests']} requests a target a round, "
        f"{meta['concurrency']} at once; after a write: {meta['writes']} writes a target a round, each then "
        f"one request; the sampler's writes: {meta.get('sampler', 'per-node')}",
        "",
        "| page or endpoint | role | queries cold / warm | bytes | "
        + " | ".join(PHASES[p].split(":")[0].split(" (")[0] for p in phases)
        + " |",
        "|---|---|---:|---:|" + "---:|" * len(phases),
    ]
    for i, first in enumerate(results[phases[0]]):
        cells = []
        for p in phases:
            r = results[p][i]
            ratio = f"**{r['ratio']}**" if r["ratio"] <= 3 else f"{r['ratio']}"
            err = f", {r['errors']} errors" if r["errors"] else ""
            cells.append(f"{r['p50_ms']} ms · {ratio}× · load {r['load']}{err}")
        lines.append(
            f"| {first['target']} | {first['role']} | {first['queries']} / {first['warm_queries']} | "
            f"{first['bytes']:,} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


# Issue 25's goals for the pages, each: what it says, the phases and targets it judges (by name:
# the dry runs and the preview; the nodes pages; every page and list), and the ratio to the floor
# at p50 none of them may pass.
DRY_RUNS = ("resize dry run", "context dry run", "resize preview")
GOALS = (
    ("dry runs and previews ≤ 2× warm", ("warm",), lambda name: name in DRY_RUNS, 2.0),
    ("every page and list ≤ 3× warm", ("warm",), lambda name: True, 3.0),
    ("every page and list ≤ 5× right after a write", ("replica", "structure"), lambda name: True, 5.0),
    (
        "the nodes pages and API ≤ 3× under the sampler's writes",
        ("sampler",),
        lambda name: name.startswith("node"),
        3.0,
    ),
)


def verdicts(results: dict[str, list[dict]]) -> list[tuple[str, bool, str]]:
    """Each goal of ``GOALS`` whose phase was measured: what it says, whether it was met (every
    row it judges within its ratio and answered without an error), and the rows that were not."""
    out = []
    for said, phases, judged, limit in GOALS:
        rows = [
            (phase, r["target"].split(":")[0], r)
            for phase in phases
            for r in results.get(phase, [])
            if not r["target"].startswith("floor")
        ]
        rows = [(phase, name, r) for phase, name, r in rows if judged(name)]
        if not rows:
            continue
        missed = [
            f"{name} {r['ratio']}× ({phase}" + (f", {r['errors']} errors)" if r["errors"] else ")")
            for phase, name, r in rows
            if r["ratio"] > limit or r["errors"]
        ]
        worst = max(r["ratio"] for _, _, r in rows)
        out.append((said, not missed, "; ".join(missed) if missed else f"at most {worst}×"))
    return out


def machine() -> str:
    cores = os.cpu_count()
    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        mem = int(next(x for x in meminfo if x.startswith("MemTotal")).split()[1]) // 2**20
    except (OSError, StopIteration):
        mem = 0
    return f"{cores} cores, {mem} GiB"
