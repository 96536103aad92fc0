"""One logged start-up (``Logged``) and the planner's figures for it (``plan``): the machinery of
tests/planning/calibration.py, whose docstring says what a point holds and how it is compared."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from planning.engines import terms_for
from planning.memory import card_memory
from planning.types import CardMemory, Shape

GIB = 2**30


@dataclass(frozen=True)
class Logged:
    """One start-up, as its log printed it, per card, in GiB."""

    source: str
    engine: str
    version: str
    model: str
    kind: str  # what it exercises: GQA, MHA, MoE, MLA, sliding window, quantized
    shape: Shape
    tp: int
    card_gib: float  # total_gpu_memory as logged
    context: int
    args: tuple[str, ...]
    weights: float
    non_torch: float
    activation: float
    kv: float | None = None  # one full-context sequence: KV memory / maximum concurrency
    cuda_graph: float | None = None
    weights_from_log: bool = False  # the checkpoint's size is not known here; the log's stands in
    # V1 logs print no split of the profile: ``non_torch`` then holds what the
    # budget keeps beside weights and KV cache (total x utilization - "Model
    # loading took" - the KV cache), activation peak and non-torch memory together.
    combined: bool = False
    excluded: str = ""  # why this point is shown but not held to the bound
    # A start-up of a current release kept out of the fit: held to the wider held-out bound.
    held_out: bool = False
    notes: str = ""
    # The card's name as the log or its post gives it, planned as the card class's name: vLLM picks its
    # batch defaults by it on cards of 70 GiB or more (an A100 kept the smaller ones). Blank on smaller
    # cards, where no default depends on it.
    card: str = ""

    @property
    def need(self) -> float:
        return self.weights + self.non_torch + self.activation + (self.kv or 0) + (self.cuda_graph or 0)


@dataclass(frozen=True)
class Compared:
    point: Logged
    memory: CardMemory
    planned: float  # GiB, the same terms as logged
    terms: dict[str, float] = field(default_factory=dict)

    @property
    def error(self) -> float:
        return self.planned / self.point.need - 1

    @property
    def rule(self) -> float:
        """Others' rule of thumb: weights x 1.2 + 2 GiB (with the same KV term)."""
        return self.point.weights * 1.2 + 2 + (self.point.kv or 0)


def plan(point: Logged) -> Compared:
    """The planner's figures for the point's start-up, on its card, with its settings."""
    args = point.args if point.cuda_graph is not None else (*point.args, "--enforce-eager")
    release = re.search(r"\d+\.\d+(?:\.\d+)*", point.version)
    memory = card_memory(
        terms_for(point.engine, release[0] if release else None),
        point.shape,
        point.tp,
        point.context,
        None,
        total=round(point.card_gib * GIB),
        args=args,
        class_name=point.card,
    )
    assert memory is not None
    # Graphs are compared where the log gives them, whether the release counts them inside its budget or
    # beside it (vLLM 0.11 to 0.20 capture them after sizing the cache).
    terms = {t.name: t.bytes / GIB for t in memory.terms if t.inside or t.name == "cuda_graph"}
    planned = (
        memory.weights / GIB
        + terms.get("activation", 0)
        + terms.get("non_torch", 0)
        + terms.get("comm_buffers", 0)
        + terms.get("cuda_graph", 0)
        + (memory.kv / GIB if point.kv is not None else 0)
    )
    return Compared(point, memory, planned, terms)


def release_of(point: Logged) -> str | None:
    """The release a point's version text names ("0.27.1" of "0.27.1 (the blog's ...)")."""
    release = re.search(r"\d+\.\d+(?:\.\d+)*", point.version)
    return release[0] if release else None


def terms_of(point: Logged) -> str:
    """The release range of the memory terms that plan ``point`` (engines.toml)."""
    return terms_for(point.engine, release_of(point)).memory.version
