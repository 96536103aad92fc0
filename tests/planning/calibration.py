"""Logged engine start-ups the memory model is held to (tests/planning/test_memory_calibration.py)
and the table docs/memory-model.md shows (``python -m tests.planning.calibration`` prints it).

Each point is one public start-up log: the figures the engine printed per card
(GiB as logged), the settings it ran with (as the log or that release's
defaults give them), and the model's shape. "Logged need" is the sum of the
terms the log prints; the planned need sums the planner's same terms, so a
term the log does not print (CUDA graphs in V0's profile, the KV cache when
no concurrency line was logged) is left out of both, and the table says so.
The KV term logged is what one full-context sequence takes: the KV cache
memory over vLLM's "Maximum concurrency" for that context.

The points live in calibration_older.py (vLLM 0.6.4 to 0.10),
calibration_current.py (0.11 and later, and the logs seen and not held) and
calibration_vllm_current.py (0.17 to 0.20: a vLLM 0.19.0 sweep on an H100 and more) and
calibration_llamacpp.py (llama.cpp; TensorRT-LLM's search, none held, in
calibration_trtllm.py); their
shapes in calibration_shapes.py; ``Logged`` and ``plan`` in calibration_logged.py. SGLang's start-ups,
whose logged need is the static pool's, and the SGLang logs seen are in calibration_sglang.py.
"""

from __future__ import annotations

from planning.engines import terms_for
from tests.planning.calibration_current import CURRENT, STORED
from tests.planning.calibration_current import NOT_HELD as NOT_HELD_VLLM_SGLANG
from tests.planning.calibration_current import UNCALIBRATED as UNCALIBRATED_CURRENT
from tests.planning.calibration_llamacpp import LLAMACPP, NOT_HELD_LLAMACPP
from tests.planning.calibration_logged import GIB, Logged, plan, terms_of
from tests.planning.calibration_older import EXCLUDED, OLDER
from tests.planning.calibration_sglang import NOT_HELD as SGLANG_NOT_HELD
from tests.planning.calibration_sglang import UNCALIBRATED as SGLANG_UNCALIBRATED
from tests.planning.calibration_sglang import table as sglang_table
from tests.planning.calibration_shapes import GPT_OSS_120B, LLAMA_3_8B, QWEN3_235B_A22B
from tests.planning.calibration_trtllm import NOT_HELD_TRTLLM, UNCALIBRATED_TRTLLM
from tests.planning.calibration_vllm_current import NOT_HELD_CURRENT, VLLM_CURRENT

__all__ = [
    "GIB",
    "GPT_OSS_120B",
    "LLAMA_3_8B",
    "NOT_HELD",
    "POINTS",
    "QWEN3_235B_A22B",
    "STORED",
    "UNCALIBRATED",
    "plan",
    "table",
]

POINTS: tuple[Logged, ...] = (*OLDER, *CURRENT, *VLLM_CURRENT, *EXCLUDED, *LLAMACPP)
NOT_HELD = (*NOT_HELD_VLLM_SGLANG, *NOT_HELD_CURRENT, *SGLANG_NOT_HELD, *NOT_HELD_TRTLLM, *NOT_HELD_LLAMACPP)
# The engines no start-up holds, with why: llama.cpp is held by calibration_llamacpp.py, TensorRT-LLM's why is
# calibration_trtllm.py's, SGLang's calibration_sglang.py's (its need is the static pool's, not vLLM's profile:
# its table is shown beside its terms).
UNCALIBRATED = {
    **{k: v for k, v in UNCALIBRATED_CURRENT.items() if k != "llamacpp"},
    "trtllm": UNCALIBRATED_TRTLLM,
    "sglang": SGLANG_UNCALIBRATED,
}
ENGINE_TABLES = {"sglang": sglang_table}


ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM", "llamacpp": "llama.cpp"}


def table() -> str:
    """The markdown tables of docs/memory-model.md: one a release range of the memory terms, vLLM's
    current releases first (a range no start-up holds says so), then each other engine's terms with
    why no start-up holds them."""
    header = [
        "| # | model | what | engine | TP | card | context | logged need | planned | error | "
        "weights x 1.2 + 2 | terms logged / planned | source |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    numbered = list(enumerate(POINTS, 1))
    ranges = list(dict.fromkeys(terms_of(p) for p in POINTS))
    for release in ("0.17", None):  # the current ranges are shown even where no start-up holds them
        described = terms_for("vllm", release).memory.version
        if described not in ranges:
            ranges.append(described)
    current = terms_for("vllm", None).memory.version
    ranges.sort(key=lambda v: (v != current, "0.17" not in v, "0.11" not in v))
    tables = []
    for described in ranges:
        held = [(i, p) for i, p in numbered if terms_of(p) == described]
        if not held:
            tables.append(
                f"#### {described}\n\nNo logged start-up with a card total was found for this range."
            )
            continue
        tables.append("\n".join([f"#### {described}", "", *header, *_rows(held)]))
    for name, why in UNCALIBRATED.items():
        tables.append(f"#### {terms_for(name, None).memory.version}\n\n{why}")
        if name in ENGINE_TABLES:
            tables.append(ENGINE_TABLES[name]())
    return "\n\n".join(tables)


def _rows(points: list[tuple[int, Logged]]) -> list[str]:
    rows = []
    for i, point in points:
        c = plan(point)
        beside = c.terms.get("non_torch", 0) + c.terms.get("comm_buffers", 0)
        terms = [
            f"weights {point.weights:.2f}/{c.memory.weights / GIB:.2f}"
            + (" (from the log)" if point.weights_from_log else ""),
        ]
        if point.combined:
            terms.append(
                f"activation and non-torch {point.non_torch:.2f}/{beside + c.terms.get('activation', 0):.2f}"
                " (budget - weights - KV cache)"
            )
        elif point.engine == "llamacpp":
            terms.append(f"compute buffer {point.activation:.2f}/{c.terms.get('activation', 0):.2f}")
        else:
            terms.append(f"activation {point.activation:.2f}/{c.terms.get('activation', 0):.2f}")
            terms.append(f"non-torch {point.non_torch:.2f}/{beside:.2f}")
        if point.kv is not None:
            terms.append(f"KV {point.kv:.2f}/{c.memory.kv / GIB:.2f}")
        else:
            terms.append("KV not logged")
        if point.cuda_graph is not None:
            terms.append(f"graphs {point.cuda_graph:.2f}/{c.terms.get('cuda_graph', 0):.2f}")
        elif point.engine == "llamacpp":
            pass  # llama.cpp captures no graphs of its own at start-up
        else:
            terms.append("graphs not in the profile")
        error = f"{c.error:+.1%}" + (
            " (not held)" if point.excluded else " (held out)" if point.held_out else ""
        )
        card = f"{point.card_gib} GiB" if point.card_gib else point.card
        rows.append(
            f"| {i} | {point.model} | {point.kind} | {ENGINE_NAMES[point.engine]} {point.version} | {point.tp} | {card} | "
            f"{point.context} | {point.need:.2f} | {c.planned:.2f} | {error} | {c.rule:.2f} | "
            f"{'; '.join(terms)} | {point.source} |"
        )
    return rows


if __name__ == "__main__":  # pragma: no cover - prints the docs table
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_web.settings")
    django.setup()
    print(table())
