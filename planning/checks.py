"""What the two planned changes (``plan``) and a replica across nodes (``spanplan``) share: the
fleet the restart is played on, the change a refusal carries, the nodes a release cannot run on,
and the sentence naming what is not known."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from base.errors import DomainError
from base.notes import Notes
from planning.engines import Engine
from planning.placement import LiveReplica, NodeCards
from planning.releases import NodeFacts, floor_of, node_refusal, unknown_facts
from planning.types import Change, GPUClassSpec, ModelSpec, ProfileSpec
from planning.units import and_list

CONTEXT_CHANGE = (
    "a context change (the model page's context form, POST /api/models/{name}/context/, or manage.py context)"
)


@dataclass(frozen=True)
class Fleet:
    """What the restart simulation reads: the class's cards on every node,
    the model's live replicas, and how many steps run at once."""

    cards: tuple[NodeCards, ...]
    replicas: tuple[LiveReplica, ...]
    parallel: int = 1
    # What each node's agent reported of itself (driver, CUDA, architecture, engines installed), by
    # node name; a node missing here is one whose facts are not known.
    facts: Mapping[str, NodeFacts] | None = None


def with_change(err: DomainError, change: Change, notes: Notes) -> DomainError:
    """``err`` again, carrying the change worked out so far."""
    return DomainError(err.code, err.message, status=err.status, change=finish(change, notes).as_dict())


def finish(change: Change, notes: Notes) -> Change:
    return replace(change, note=notes.text())


def floor_refusals(
    eng: Engine, p: ProfileSpec, fleet: Fleet | None, nodes: Iterable[str], notes: Notes
) -> dict[str, DomainError]:
    """Each node that cannot run ``p``'s engine release, with why (``planning.releases.node_refusal``);
    a note names the nodes whose facts are not known. Nothing when the fleet's facts were not given."""
    if fleet is None or fleet.facts is None:
        return {}
    floor = floor_of(eng.floors, p.engine_version)
    refused: dict[str, DomainError] = {}
    unknown: list[str] = []
    for node in sorted(set(nodes)):
        facts = fleet.facts.get(node) or NodeFacts(node=node)
        if not facts.known:
            unknown.append(node)
        err = node_refusal(eng.name, p.engine_version, floor, facts)
        if err is not None:
            refused[node] = err
    if unknown and (floor is not None or p.engine_version):
        notes.add(unknown_facts(unknown))
    return refused


def card_of(spec: GPUClassSpec | None) -> dict[str, Any]:
    """The card facts the memory model reads beyond the usable bytes."""
    if spec is None:
        return {"total": None, "class_name": ""}
    return {"total": spec.total_bytes or None, "class_name": spec.name}


def unknown_note(model: ModelSpec, context: int | None, *, heads_checked: bool | None) -> str | None:
    """One sentence naming what is not known and the checks that skips; None
    when nothing was skipped. ``heads_checked`` is None when the head split is
    not a check of this change."""
    shape = model.shape
    heads, memory = "how its heads split over the cards", "what each card holds"
    skipped: list[str] = []
    unknown: list[tuple[str, bool]] = []  # (what, is it plural)
    if shape is None:
        skipped = [heads, memory] if heads_checked is False else [memory]
        unknown = [("shape", False)]
    else:
        if heads_checked is False:
            skipped.append(heads)
            unknown += [
                (what, True)
                for what, n in (("KV heads", shape.kv_heads), ("attention heads", shape.attention_heads))
                if not n
            ]
        missing = [
            (what, plural)
            for what, plural, known in (
                ("weight bytes", True, shape.weight_bytes is not None),
                ("KV-cache bytes per token", True, shape.kv_bytes_per_token is not None),
                ("context", False, bool(context)),
            )
            if not known
        ]
        if missing:
            skipped.append(memory)
            unknown += missing
    if not skipped:
        return None
    verb = "are" if len(unknown) > 1 or unknown[0][1] else "is"
    checks = "are" if len(skipped) > 1 else "is"
    what = and_list([w for w, _ in unknown])
    return f"{model.name}'s {what} {verb} not known, so {and_list(skipped)} {checks} not checked."
