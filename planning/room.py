"""Whether the new replicas fit on the nodes: beside the running ones (a
rolling restart), or in place once the model's own are stopped."""

from __future__ import annotations

from collections.abc import Iterable

from base.errors import DomainError
from planning.types import NodeRoom, Room
from planning.units import cards


def room_for(nodes: Iterable[NodeRoom], gpu_class: str, n: int, *, running: bool, in_place: bool) -> Room:
    """Where a replica of ``n`` cards of ``gpu_class`` on one node can start.

    Only ready nodes count. Refuses (409) when no ready node has the class
    (``no_class``), when none has ``n`` such cards at all
    (``too_few_cards``), and — for a model with running replicas — when no
    node has ``n`` free even with the model's own stopped (``no_room``), or
    has them only that way and ``in_place`` was not asked for
    (``no_room_beside``). With nothing running, or with room beside, the
    answer is a rolling restart even if ``in_place`` was asked for.
    """
    kinds = [r for r in nodes if r.ready and r.gpu_class == gpu_class]
    if not kinds:
        raise DomainError(
            "no_class",
            f"No ready node has {gpu_class} cards. Uncordon a node of that class (or wait until its agent "
            "answers), add one, or give the profile another GPU class.",
            status=409,
        )

    most = max(r.cards for r in kinds)
    free_most = max(r.free for r in kinds)
    beside = tuple(r.node for r in kinds if r.free >= n)
    in_place_nodes = tuple(r.node for r in kinds if r.free + r.own >= n)

    if most < n:
        raise DomainError(
            "too_few_cards",
            f"No node has {n} {gpu_class} cards; the most one has is {most}. Ask for {most} or fewer, or add a "
            f"node with {n}.",
            status=409,
        )
    if not running or beside:
        return Room(in_place=False, beside=beside, in_place_nodes=in_place_nodes)
    if not in_place_nodes:
        raise DomainError(
            "no_room",
            f"No node has {n} {gpu_class} cards free, even with this model's own replicas stopped "
            f"({free_most} at most are free now): other models hold them. Free {n} on one node (move or "
            "stop another model's replica there; the nodes page shows who holds each card), or ask for fewer.",
            status=409,
        )
    if not in_place:
        raise DomainError(
            "no_room_beside",
            f"No node has {n} {gpu_class} cards free beside the running replicas ({free_most} at most "
            f"are free now). Restarting in place stops each replica before its replacement starts on "
            f"the freed {cards(n)}; the model does not answer while the new one loads.",
            status=409,
        )
    return Room(in_place=True, beside=beside, in_place_nodes=in_place_nodes)
