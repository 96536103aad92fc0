"""What each rank of a replica across nodes holds, for an engine that runs one pipeline stage a
node (engines.toml ``span = "pipeline"``: vLLM, TP = a node's cards, PP = nodes).

Each stage holds its share of the decoder layers (``stage_layers``, vLLM's split), the token
embedding on the first stage and the output head on the last, and the KV cache of its own layers;
each of its cards then holds the stage's weights and cache split by TP, and the engine's terms at
that TP (``memory.card_memory``). Only the last stage samples, so only its activation term counts
the sampler's logits. The stage that needs the most is the replica's answer: every rank must fit.

An engine that runs tensor parallel over every card of every node (``span = "tensor"``: SGLang)
has no stages: each card holds its 1/TP of everything, as on one node (``memory.card_memory`` at
TP = all the cards).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from planning.engines import Engine
from planning.memory import MODEL_DTYPE, card_memory
from planning.types import CardMemory, Shape

STAGE_SPLIT_SOURCE = (
    "vllm/distributed/utils.py get_pp_indices (vLLM, as read): layers // PP a stage, the remainder one "
    "each to the stages before the last, from the second-to-last back (VLLM_PP_LAYER_PARTITION overrides "
    "it; the planner does not read it); the embedding (VocabParallelEmbedding) on the first rank and the "
    "head (ParallelLMHead) on the last, PPMissingLayer elsewhere (vllm/model_executor/models/llama.py)"
)


def stage_layers(layers: int, stages: int) -> list[int]:
    """How many decoder layers each pipeline stage holds, first stage first (vLLM's split)."""
    counts = [layers // stages] * stages
    for i in range(2, layers % stages + 2):
        counts[-i] += 1
    return counts


@dataclass(frozen=True)
class Stage:
    """One pipeline stage (rank ``index``): its layers and what each of its cards holds."""

    index: int
    first_layer: int
    layers: int
    stages: int
    memory: CardMemory

    @property
    def holds(self) -> str:
        """E.g. "layers 0-62 and the embedding"."""
        extra = [
            part
            for part, present in (
                ("the embedding", self.index == 0),
                ("the output head", self.index == self.stages - 1),
            )
            if present
        ]
        text = f"layers {self.first_layer}-{self.first_layer + self.layers - 1}"
        return text + (" with " + " and ".join(extra) if extra else "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "stage": self.index,
            "first_layer": self.first_layer,
            "layers": self.layers,
            "holds": self.holds,
            "memory": self.memory.as_dict(),
        }


def _embedding_bytes(shape: Shape) -> int:
    """One vocabulary x hidden matrix (the embedding, or the head), in the 16 bits engines keep it:
    0 when either size is unknown (the whole weight is then spread by layers)."""
    if not shape.vocab_size or not shape.hidden_size:
        return 0
    return shape.vocab_size * shape.hidden_size * MODEL_DTYPE


def stage_shape(shape: Shape, index: int, stages: int) -> Shape:
    """The part of ``shape`` stage ``index`` of ``stages`` holds, as a shape of its own: its layers'
    share of the decoder weights, experts, replicated weights and KV bytes a token, the embedding on
    the first stage and the head on the last (each counted untied: the shape does not say whether the
    head shares the embedding's matrix), the vocabulary only on the last (it alone samples)."""
    assert shape.layers  # the caller checked
    counts = stage_layers(shape.layers, stages)
    share = counts[index] / shape.layers
    embedding = _embedding_bytes(shape)
    weights = None
    if shape.weight_bytes is not None:
        ends = embedding * ((index == 0) + (index == stages - 1))
        decoder = max(shape.weight_bytes - 2 * embedding, 0)
        weights = round(decoder * share) + ends
    return replace(
        shape,
        layers=counts[index],
        weight_bytes=weights,
        expert_bytes=round(shape.expert_bytes * share) if shape.expert_bytes else shape.expert_bytes,
        replicated_bytes=round(shape.replicated_bytes * share),
        kv_bytes_per_token=(
            round(shape.kv_bytes_per_token * share) if shape.kv_bytes_per_token is not None else None
        ),
        sliding_layers=round(shape.sliding_layers * share),
        vocab_size=shape.vocab_size if index == stages - 1 else 0,
    )


def pipeline_memory(
    eng: Engine,
    shape: Shape | None,
    tp: int,
    stages: int,
    context: int | None,
    budget: int | None,
    *,
    total: int | None = None,
    args: Sequence[str] = (),
    class_name: str = "",
) -> tuple[Stage, ...] | None:
    """Each stage's memory over its ``tp`` cards, first stage first; None when the layers, the
    weights, the KV bytes a token or the context are not known (the check is skipped and the
    caller says so)."""
    if shape is None or not shape.layers or shape.layers < stages or stages < 1:
        return None
    out = []
    first = 0
    for index, layers in enumerate(stage_layers(shape.layers, stages)):
        memory = card_memory(
            eng,
            stage_shape(shape, index, stages),
            tp,
            context,
            budget,
            total=total,
            args=args,
            class_name=class_name,
        )
        if memory is None:
            return None
        out.append(Stage(index, first, layers, stages, memory))
        first += layers
    return tuple(out)


def fullest(stages: Sequence[Stage]) -> Stage:
    """The stage whose cards need the most (the first of equals): the one that must fit."""
    return max(stages, key=lambda s: (s.memory.need, -s.index))


def longest_pipeline_context(
    eng: Engine,
    shape: Shape,
    tp: int,
    stages: int,
    budget: int | None,
    below: int,
    *,
    total: int | None = None,
    args: Sequence[str] = (),
    class_name: str = "",
) -> int | None:
    """The most tokens under ``below`` for which every stage fits, or None when not even one does."""
    low, high = 0, below - 1
    while low < high:
        mid = (low + high + 1) // 2
        found = pipeline_memory(
            eng, shape, tp, stages, mid, budget, total=total, args=args, class_name=class_name
        )
        if found is not None and all(s.memory.fits for s in found):
            low = mid
        else:
            high = mid - 1
    return low or None
